"""A run folder is the run's alone: taken before any data is read, never holding two runs, never losing a
user's own files, never written through a link (issue findings 1-3, and a lock file that is a pipe)."""

import os
import subprocess
import sys

import pytest

from p2pfl import testing
from p2pfl.runner.configure import make_config, resolve
from p2pfl.errors import UserError
from p2pfl.runner.paths import PROBE_PREFIX
from p2pfl.runner.simulation import execute
from tests.conftest import ROOT

TINY = [
    "--dataset",
    "synthetic",
    "--peers",
    "4",
    "--kappa",
    "2",
    "--rounds",
    "1",
    "--samples-per-peer",
    "20",
    "--local-epochs",
    "1",
    "--test-samples",
    "50",
    "--no-progress",
]


def tiny_config(out, **more):
    values = {
        "dataset": "synthetic",
        "peers": 4,
        "kappa": 2,
        "rounds": 1,
        "samples_per_peer": 20,
        "local_epochs": 1,
        "test_samples": 50,
        "progress": False,
        "out": str(out),
        **more,
    }
    return resolve(make_config(values), 1)


def test_a_folder_that_came_to_hold_a_run_since_start_up_is_refused_and_left_as_it_was(tmp_path):
    """The start-up check saw an empty folder; another run then finished there. Taking the folder refuses,
    and the other run's files stay (the second run used to remove them and exit 0)."""
    out = tmp_path / "run"
    cfg = tiny_config(out)  # checked now: the folder does not exist yet
    out.mkdir()
    (out / "metrics.jsonl").write_text("the other run's rows\n")
    (out / "model.pt").write_bytes(b"the other run's model")
    with pytest.raises(UserError, match="now holds files"):
        execute(cfg, 0, 1, 0)
    assert (out / "metrics.jsonl").read_text() == "the other run's rows\n"
    assert (out / "model.pt").read_bytes() == b"the other run's model"


def test_another_ranks_write_test_inside_the_new_folder_is_no_run(tmp_path):
    """Under mpirun a rank behind rank 0 tries whether --out can be written with a throwaway folder inside
    the run folder rank 0 has just made: rank 0 took that for a finished run's files and refused its own
    new folder (seen once in 84 runs of bench/same_trees.py, dispfl-dirichlet on three ranks)."""
    out = tmp_path / "run"
    cfg = tiny_config(out)  # checked now: the folder does not exist yet
    out.mkdir()
    (out / f"{PROBE_PREFIX}x1y2").mkdir()  # as another rank's _check_writable leaves it for a moment
    execute(cfg, 0, 1, 0)
    assert testing.results(out)["metrics"]


@pytest.mark.subprocess
def test_two_runs_started_together_into_one_new_folder(tmp_path):
    out = tmp_path / "shared"
    cmd = [sys.executable, "-m", "p2pfl.run", *TINY, "--out", str(out)]
    runs = [subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in "ab"]
    done = [(run.wait(timeout=300), run.stderr.read()) for run in runs]
    codes = sorted(code for code, _ in done)
    assert codes == [0, 2], done
    refusal = next(err for code, err in done if code == 2)
    assert len(refusal.strip().splitlines()) == 1 and ("in use" in refusal or "holds files" in refusal), refusal
    assert testing.results(out)["metrics"] and (out / "model.pt").is_file()


def test_overwrite_leaves_a_users_own_files(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    own = {"results.json": "{}", "figure.png": "not a png", "weights.pt": "mine", "notes.txt": "hello"}
    for name, text in own.items():
        (out / name).write_text(text)
    result = testing.run_in_process([*TINY, "--out", str(out), "--overwrite"])
    assert result.returncode == 0, result.stderr
    assert {name: (out / name).read_text() for name in own} == own
    assert (out / "metrics.jsonl").is_file()


@pytest.mark.parametrize("name", ["model.pt.tmp", "final.json", "checkpoint"])
def test_a_planted_link_among_the_run_files_is_refused_and_nothing_is_written_outside(tmp_path, name):
    out, outside = tmp_path / "run", tmp_path / "outside"
    out.mkdir()
    outside.write_text("untouched")
    (out / name).symlink_to(outside)
    result = testing.run_in_process([*TINY, "--out", str(out), "--overwrite"])
    assert result.returncode == 2 and f"{name} is a link" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert outside.read_text() == "untouched" and (out / name).is_symlink()


@pytest.mark.parametrize("target", ["nothing-here", "/proc/version"])
def test_a_lock_file_that_is_a_link_is_refused_naming_it(tmp_path, target):
    out = tmp_path / "run"
    out.mkdir()
    lock = out / ".p2pfl-lock"
    lock.symlink_to(tmp_path / target if target == "nothing-here" else target)
    result = testing.run_in_process([*TINY, "--out", str(out), "--overwrite"])
    assert result.returncode == 2 and f"{lock} cannot be the run's lock file: it is a link" in result.stderr
    assert not (tmp_path / "nothing-here").exists()


def test_a_lock_file_that_is_a_named_pipe_is_refused_without_waiting(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    os.mkfifo(out / ".p2pfl-lock")
    result = testing.run_in_process([*TINY, "--out", str(out), "--overwrite"])
    assert result.returncode == 2 and "not a regular file" in result.stderr, result.stderr
