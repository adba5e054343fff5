"""The device check (bench/gpu_check.sh) rehearsed here on every change, on the GPU machine's package set: the
modules that machine lacks are blocked from import (bench/emulate/sitecustomize.py) and it has no mpirun, so a
new dependency that would stop the check there stops it here first. Beside it, every bench script runs at a
tiny size, and the cuda tests' comparisons are shown to fail on the differences they are for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from gpu_carry import CARRY_LIMIT, folder_bytes, prepare  # noqa: E402

LACKING = "tomli_w"  # of p2pfl's requirements, what the GPU machine lacks (its package list): the check carries it
RESULT_FILES_BACK = 8  # at most, from a device call


def emulated(carry: Path | None, blocked: str = LACKING, **env) -> dict:
    """The environment of a run on the GPU machine as this one emulates it."""
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT / "bench" / "emulate"),
        "P2PFL_BLOCK_MODULES": blocked,
        "P2PFL_BLOCK_EXCEPT": str(carry / "site") if carry else "",
        "P2PFL_MPIRUN": "none",
        "P2PFL_NO_DOWNLOAD": "1",
        **env,
    }


def rehearse(
    tmp_path: Path, carry: Path | None, blocked: str = LACKING, steps: str = ""
) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "out"
    env = emulated(carry, blocked, GPU_CHECK_DEVICE="cpu", GPU_CHECK_QUICK="1", GPU_CHECK_STEPS=steps, OUT=str(out))
    env["GPU_CHECK_CARRY"] = str(carry or tmp_path / "nothing-carried")
    done = subprocess.run(
        ["bash", "bench/gpu_check.sh", sys.executable], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    return done, out


@pytest.fixture(scope="module")
def carry(tmp_path_factory) -> Path:
    """What `make gpu-carry` prepares, without the data (the rehearsal reads this machine's)."""
    folder = tmp_path_factory.mktemp("carry") / "gpu-carry"
    prepare(folder, data=None)
    return folder


@pytest.mark.subprocess
def test_the_emulated_machine_lacks_what_it_should(carry):
    """The emulation itself: a blocked module fails to import unless carried, and there is no mpirun."""
    probe = "import importlib.util, p2pfl.testing as t; import tomli_w; print(tomli_w.__file__, t.mpirun())"
    run = subprocess.run([sys.executable, "-c", probe], env=emulated(None), capture_output=True, text=True, cwd=ROOT)
    assert run.returncode != 0 and "No module named 'tomli_w'" in run.stderr
    run = subprocess.run([sys.executable, "-c", probe], env=emulated(carry), capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0 and run.stdout.split() == [str(carry / "site" / "tomli_w" / "__init__.py"), "None"]


@pytest.mark.subprocess
def test_the_device_check_runs_every_step_on_the_gpu_machines_package_set(tmp_path, carry):
    done, out = rehearse(tmp_path, carry)
    summary = (out / "gpu_check.txt").read_text()
    assert done.returncode == 0, summary + done.stderr[-2000:]
    assert "all steps passed" in summary
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.txt", "gpu_check_logs.tar.gz"]
    assert len(list(out.iterdir())) <= RESULT_FILES_BACK
    with tarfile.open(out / "gpu_check_logs.tar.gz") as archive:
        names = {Path(n).name for n in archive.getnames()}
    steps = ("keyed", "cuda-tests", "smoke", "conformance") + tuple(
        f"figure-{f}-gpu" for f in ("dfedavg", "ntk-dfl", "tct-stage1", "dfedavg-cnn")
    )
    assert {f"{s}.log" for s in steps} <= names and {"keyed.xml", "cuda-tests.xml", "smoke.jsonl"} <= names
    for line in ("keyed hashes, CPU = GPU bit for bit: passed", "1 passed, 0 failed", "smoke matrix: passed"):
        assert line in summary, summary


@pytest.mark.subprocess
def test_without_the_carried_module_the_check_stops_at_its_gate_and_says_why(tmp_path):
    done, out = rehearse(tmp_path, None)
    assert done.returncode == 2
    assert "lacks tomli_w" in (out / "gpu_check.txt").read_text() and "make gpu-carry" in done.stderr


@pytest.mark.subprocess
def test_a_step_that_needs_a_missing_module_fails_the_check_by_its_exit_status(tmp_path, carry):
    """matplotlib blocked: the speed figures need none of it and pass (two of them, an MLP's and NTK-DFL's:
    one script draws all four); the smoke matrix's runs draw their figures, so that step fails, and the
    summary says so from the step's own results. Those steps alone: the whole check runs in the test above."""
    figures = " ".join(f"figure-{f}-gpu" for f in ("dfedavg", "ntk-dfl"))
    done, out = rehearse(tmp_path, carry, blocked=f"{LACKING},matplotlib", steps=f"{figures} smoke")
    summary = (out / "gpu_check.txt").read_text()
    assert done.returncode == 1 and "NOT ALL STEPS PASSED" in summary
    assert "smoke matrix: FAILED" in summary and "0 OK" in summary
    assert "figure steps not passed" not in summary  # the figures import no plotting


def test_the_carried_folder_fits_a_device_call(tmp_path):
    size = prepare(tmp_path / "carry")
    assert size <= CARRY_LIMIT and size == folder_bytes(tmp_path / "carry")
    assert (tmp_path / "carry" / "site" / "tomli_w" / "__init__.py").is_file()
    if Path("/usr/share/datasets/fashion-mnist").is_dir():
        assert len(list((tmp_path / "carry" / "fashion-mnist").glob("*-ubyte.gz"))) == 4


def test_the_report_reads_verdicts_from_exit_statuses_and_result_files(tmp_path):
    """A passing log whose last line is a warning is not a failure, and a step cut at its limit is one."""
    from gpu_report import summary

    (tmp_path / "machine.txt").write_text("a test machine\n")
    (tmp_path / "steps.tsv").write_text(
        "keyed\t0\t3\t90\ncuda-tests\t124\t200\t200\nfigure-dfedavg-cpu\t125\t0\tno time\n"
    )
    (tmp_path / "keyed.xml").write_text(
        '<testsuite tests="1" failures="0" errors="0" skipped="0"><testcase name="k"/></testsuite>'
    )
    (tmp_path / "figure-dfedavg-gpu.json").write_text(
        json.dumps({"device": "cuda:0", "best": 0.1, "peak_gpu_gb": 1.0, "epochs": 20, "taus": None, "finite": True})
    )
    lines, passed = summary(tmp_path, 10)
    text = "\n".join(lines)
    assert not passed and "cuda tests (against the CPU): stopped at its time limit" in text
    assert "keyed hashes, CPU = GPU bit for bit: passed in 3 s; 1 passed" in text
    (tmp_path / "steps.tsv").write_text("keyed\t0\t3\t90\nfigure-dfedavg-cpu\t125\t0\tno time\n")
    assert summary(tmp_path, 10)[1]  # a CPU baseline skipped for time is no failure


def test_the_t_comparison_fails_when_one_peer_chose_another_t():
    from tests.test_cuda import assert_round_follows

    weights, scores = torch.ones(3, 5), {"acc": torch.tensor([0.5, 0.6]), "loss": torch.tensor([1.0, 1.1])}
    assert_round_follows(0, (weights, scores, [100, 200, 300]), (weights, scores, [100, 200, 300]), chooses_t=True)
    with pytest.raises(AssertionError, match="chosen t"):
        assert_round_follows(0, (weights, scores, [100, 200, 300]), (weights, scores, [100, 800, 300]), chooses_t=True)
    with pytest.raises(AssertionError, match="no chosen t read"):
        assert_round_follows(0, (weights, scores, []), (weights, scores, []), chooses_t=True)


def test_the_chosen_t_is_read_from_what_ntk_dfl_reports():
    """The reading the cuda test and the speed figure rely on: one t per peer, each a candidate."""
    from tests.test_cuda import rounds_on

    values = {"dataset": "synthetic", "algo": "ntk-dfl", "peers": 6, "kappa": 2, "samples_per_peer": 20}
    values["ntk_taus"] = [5, 10]
    (_, _, taus), *_ = rounds_on("cpu", values, 1)
    assert len(taus) == 6 and set(taus) <= {5, 10}


BENCH = [  # every script of `make bench` and of the device check, at a tiny size
    ["bench_dfedavg.py", "--peers", "6", "--epochs", "1", "--ranks", "1", "--device", "cpu", "--dataset", "synthetic"],
    ["bench_cnn.py", "--clients", "4", "--per-round", "2", "--samples", "30", "--epochs", "1", "--repeats", "1"],
    ["bench_cnn.py", "--tct-stage1", "--device", "gpu", "--repeats", "1"],
    ["bench_eval.py", "--clients", "6", "--rounds", "2"],
    ["bench_codecs.py", "--peers", "6", "--rounds", "1", "--dataset", "synthetic", "--codecs", "dense,qsgd-4"],
    ["bench_async.py", "--peers", "8", "--rounds", "1", "--dataset", "synthetic"],
    [
        "bench_ntk.py",
        "--peers",
        "12",
        "--samples",
        "30",
        "--rounds",
        "1",
        "--ranks",
        "1",
        "--skip-dense",
        "--device",
        "cpu",
    ],
    ["ntk_launches.py", "--peers", "12", "--samples", "20", "--rounds", "1", "--dataset", "synthetic"],
    [
        "gpu_figures.py",
        "dfedavg",
        "--device",
        "cpu",
        "--peers",
        "6",
        "--samples",
        "30",
        "--rounds",
        "1",
        "--epochs",
        "1",
    ],
    ["gpu_smoke.py", "--device", "cpu", "--only", "fedavg", "--timeout", "120"],
]


@pytest.mark.subprocess
@pytest.mark.parametrize("script", BENCH, ids=lambda s: " ".join(s[:2]))
def test_each_bench_script_runs_at_a_tiny_size(script, tmp_path):
    env = {**os.environ, "P2PFL_NO_DOWNLOAD": "1"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script[0]), *script[1:]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert done.stdout.strip(), "the script printed nothing"
