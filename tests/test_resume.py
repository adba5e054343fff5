"""Checkpoints, --resume and faults: a run stopped by Ctrl-C, by a stalled or a killed rank, resumes to
exactly the numbers of the uninterrupted run, also on another number of ranks."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from p2pfl import testing
from tests.conftest import ROOT, run_cli, run_here
from tests.helpers import metric_lines

BASE = ["--dataset", "synthetic", "--peers", "12", "--rounds", "6", "--no-progress", "--checkpoint-every", "1"]
SLOW = ["--local-epochs", "40"]  # rounds long enough to be interrupted mid-run


def _start(args, out, ranks=0, mpi_options=()):
    cmd = [sys.executable, "-m", "p2pfl.run", *args, "--out", str(out)]
    if ranks:
        cmd = testing.mpirun_command(ranks, *mpi_options, *cmd)
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_rows(proc, out, rows, limit=300):
    """Until metrics.jsonl holds `rows` rounds (the run is mid-way), or fail."""
    path, start = out / "metrics.jsonl", time.monotonic()
    while not (path.exists() and len(path.read_text().splitlines()) >= rows):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() - start < limit
        time.sleep(0.05)


def _rank_pid(proc, rank):
    """The pid of MPI rank `rank` of the job that `proc` (mpirun) launched: a descendant of proc with
    OMPI_COMM_WORLD_RANK=rank in its environment (a rank of an earlier job may still be exiting)."""
    for pid in subprocess.run(["pgrep", "-f", "p2pfl.run"], capture_output=True, text=True).stdout.split():
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if f"OMPI_COMM_WORLD_RANK={rank}".encode() in env and _descends_from(int(pid), proc.pid):
            return int(pid)
    raise AssertionError(f"no process of rank {rank}")


def _descends_from(pid: int, ancestor: int) -> bool:
    while pid > 1:
        try:
            pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])  # the parent's pid
        except (OSError, ValueError, IndexError):
            return False
        if pid == ancestor:
            return True
    return False


def _same_run(a, b):
    assert metric_lines(a) == metric_lines(b)
    full, resumed = torch.load(a / "model.pt"), torch.load(b / "model.pt")
    assert full.keys() == resumed.keys() and all(torch.equal(full[k], resumed[k]) for k in full)
    if (a / "final.json").exists():
        assert json.loads((a / "final.json").read_text()) == json.loads((b / "final.json").read_text())


def _full_and_ctrl_c(tmp_path, args, rows):
    """The uninterrupted run into full/, and the same run into cut/ stopped by Ctrl-C once `rows` rounds
    are done; returns the stopped run's stderr."""
    full = run_here(*args, "--out", str(tmp_path / "full"))
    assert full.returncode == 0, full.stderr
    proc = _start(args, tmp_path / "cut")
    _wait_for_rows(proc, tmp_path / "cut", rows)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    return err


def _interrupt_and_resume(tmp_path, args, resume_ranks=0):
    err = _full_and_ctrl_c(tmp_path, args, 2)
    assert "continue with: python -m p2pfl.run --resume" in err and "Traceback" not in err
    assert any((tmp_path / "cut" / plot).exists() for plot in ("accuracy.png", "loss.png"))  # loss: regression
    done = json.loads((tmp_path / "cut" / "checkpoint" / "latest.json").read_text())["round"]
    assert len((tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()) == done
    resumed = run_cli("--resume", str(tmp_path / "cut"), "--no-progress", ranks=resume_ranks)
    assert resumed.returncode == 0, resumed.stderr
    _same_run(tmp_path / "full", tmp_path / "cut")
    assert not (tmp_path / "cut" / "checkpoint").exists()  # a finished run keeps none


@pytest.mark.mpi
def test_ctrl_c_on_one_process_then_resume_on_three_ranks(tmp_path):
    _interrupt_and_resume(tmp_path, [*BASE, *SLOW, "--algo", "dfedavg", "--kappa", "3", "--save-edges"], resume_ranks=3)
    full = (tmp_path / "full" / "edges.jsonl").read_text()
    assert full == (tmp_path / "cut" / "edges.jsonl").read_text()


@pytest.mark.mpi
def test_a_stalled_rank_stops_the_job_with_one_line_and_exit_4(tmp_path):
    """Rank 2 is stopped (SIGSTOP) mid-run: the others give up after --comm-timeout with one line naming
    the round, the phase, the missing peers and their rank; the checkpoint resumes on one process."""
    # 8 s: rank 0 writes the run's header (matplotlib's first import, the partition's plot) while the
    # others wait for round 1's broadcast, which took over 3 s on a loaded CI machine
    args = [*BASE, *SLOW, "--algo", "dfedavg", "--kappa", "3", "--comm-timeout", "8"]
    proc = _start(args, tmp_path / "cut", ranks=3)
    _wait_for_rows(proc, tmp_path / "cut", 2)
    victim = _rank_pid(proc, 2)
    os.kill(victim, signal.SIGSTOP)
    start = time.monotonic()
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        subprocess.run(["kill", "-9", str(victim)], capture_output=True)
    assert time.monotonic() - start < 8 + 10
    assert proc.returncode == 4, err
    ours = [line for line in err.splitlines() if line.startswith("p2pfl:")]
    assert len(ours) == 1 and ours[0].startswith("p2pfl: stopped: round "), err
    named = re.search(r"no message after 8 s from peers \[([\d, ]+)\] on ranks \[2\]$", ours[0])
    assert named, ours[0]
    peers = [int(p) for p in named.group(1).split(",")]
    assert len(set(peers)) == len(peers) and set(peers) <= {8, 9, 10, 11}  # rank 2's, each once
    assert "Traceback" not in err
    assert run_here(*args, "--out", str(tmp_path / "full")).returncode == 0
    assert run_here("--resume", str(tmp_path / "cut"), "--no-progress").returncode == 0
    _same_run(tmp_path / "full", tmp_path / "cut")


@pytest.mark.mpi
def test_sigterm_to_one_rank_stops_the_job_and_saves_the_last_common_round(tmp_path):
    """A node preempted: SIGTERM reaches rank 1 alone, mid-round. It tells the others, they stop as if
    signalled, and together they save the newest round they all hold, within seconds (not after
    --comm-timeout); one line, exit 143; the checkpoint resumes to the whole run's numbers."""
    args = [*BASE, *SLOW, "--algo", "dfedavg", "--kappa", "3", "--checkpoint-every", "0"]
    proc = _start(args, tmp_path / "cut", ranks=3)
    _wait_for_rows(proc, tmp_path / "cut", 2)
    os.kill(_rank_pid(proc, 1), signal.SIGTERM)
    start = time.monotonic()
    _, err = proc.communicate(timeout=120)
    assert time.monotonic() - start < 10, err
    assert proc.returncode == 143, err
    ours = [line for line in err.splitlines() if line.startswith("p2pfl:")]
    assert len(ours) == 1 and "by a stop of rank 1: SIGTERM" in ours[0] and "checkpoint after round" in ours[0], err
    assert json.loads((tmp_path / "cut" / "checkpoint" / "latest.json").read_text())["round"] >= 2
    assert run_here(*args, "--out", str(tmp_path / "full")).returncode == 0
    assert run_here("--resume", str(tmp_path / "cut"), "--no-progress").returncode == 0
    _same_run(tmp_path / "full", tmp_path / "cut")


@pytest.mark.mpi
def test_a_killed_rank_is_named_under_ulfm_and_the_run_resumes(tmp_path):
    """Rank 1 is killed mid-run under mpirun --with-ft ulfm: MPI reports the failure at once, one line
    names the rank's peers, exit 4; the checkpoint resumes on one process (the resumed run equals the whole
    one on any layout: test_ctrl_c_on_one_process_then_resume_on_three_ranks)."""
    args = [*BASE, *SLOW, "--algo", "dfedavg", "--kappa", "3"]
    proc = _start(args, tmp_path / "cut", ranks=3, mpi_options=("--with-ft", "ulfm"))
    _wait_for_rows(proc, tmp_path / "cut", 2)
    os.kill(_rank_pid(proc, 1), signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 4, err
    ours = [line for line in err.splitlines() if line.startswith("p2pfl:")]
    assert len(ours) == 1 and "rank failed" in ours[0] and "on ranks [1]" in ours[0], err
    assert run_here(*args, "--out", str(tmp_path / "full")).returncode == 0
    assert run_here("--resume", str(tmp_path / "cut"), "--no-progress").returncode == 0
    _same_run(tmp_path / "full", tmp_path / "cut")


def test_resume_refuses_changes_and_folders_without_a_checkpoint(tmp_path):
    args = [*BASE, "--algo", "dfedavg", "--kappa", "3", "--local-epochs", "1", "--out", str(tmp_path / "run")]
    assert run_here(*args).returncode == 0
    changed = run_here("--resume", str(tmp_path / "run"), "--lr", "0.5")
    assert changed.returncode == 2 and "--lr is 0.1 there, 0.5 here" in changed.stderr
    finished = run_here("--resume", str(tmp_path / "run"))
    assert finished.returncode == 2 and "finished all its 6 rounds" in finished.stderr
    nothing = run_here("--resume", str(tmp_path / "nowhere"))
    assert nothing.returncode == 2 and "no config.toml" in nothing.stderr


@pytest.mark.subprocess
def test_checkpoints_load_without_unpickling_objects(tmp_path):
    """What a checkpoint holds loads with weights_only=True: tensors, numbers, strings, lists, dicts."""
    from p2pfl.runner.checkpoint import files as checkpoint

    args = [*BASE, *SLOW, "--algo", "scaffold"]
    proc = _start(args, tmp_path / "cut")
    _wait_for_rows(proc, tmp_path / "cut", 2)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=300)
    files = sorted((tmp_path / "cut" / checkpoint.FOLDER).glob("slot*.pt"))
    assert files
    for path in files:
        state = torch.load(path, weights_only=True)
        assert state["peers"] == list(range(12)) and state["flat"].shape[0] == 12
        assert set(state["peer_state"]) == {"c_local"} and set(state["server"]) == {"c_global"}


@pytest.mark.subprocess
def test_tct_interrupted_in_stage_2_resumes_from_the_end_of_stage_1(tmp_path):
    """TCT checkpoints stage 1 only: a stop in stage 2 resumes at the switch, convexifies again, and
    ends with the uninterrupted run's numbers and linear model."""
    from tests.conftest import write_stripes

    (tmp_path / "digits").mkdir()
    digits = write_stripes(tmp_path / "digits", 4, 120, 40)
    args = [
        "--algo",
        "tct",
        "--dataset",
        "mnist",
        "--data-dir",
        str(digits),
        "--model",
        "simple-cnn",
        "--peers",
        "4",
        "--partition",
        "classes",
        "--classes-style",
        "niid-bench",
        "--classes-per-peer",
        "1",
        "--tct-stage1-rounds",
        "2",
        "--tct-stage2-rounds",
        "5",
        "--tct-features",
        "2000",
        "--tct-local-steps",
        "400",
        "--tct-lr",
        "1e-5",
        "--local-epochs",
        "1",
        "--batch-size",
        "16",
        "--no-progress",
        "--checkpoint-every",
        "1",
    ]
    _full_and_ctrl_c(tmp_path, args, 3)
    assert json.loads((tmp_path / "cut" / "checkpoint" / "latest.json").read_text())["round"] == 2
    assert run_here("--resume", str(tmp_path / "cut"), "--no-progress").returncode == 0
    _same_run(tmp_path / "full", tmp_path / "cut")
    linear = [torch.load(tmp_path / run / "tct_linear.pt", weights_only=True) for run in ("full", "cut")]
    assert all(torch.equal(linear[0][k], linear[1][k]) for k in linear[0])


def test_a_resume_refuses_a_graph_or_partition_file_changed_since_the_run_started(tmp_path):
    """It continued on the new graph and exited 0, its next rounds other than the uninterrupted run's."""
    graph, run = tmp_path / "ring.txt", tmp_path / "run"
    graph.write_text("".join(f"{i} {(i + 1) % 6}\n" for i in range(6)))
    args = ["--dataset", "synthetic", "--peers", "6", "--rounds", "2", "--checkpoint-every", "1", "--no-progress"]
    cut = testing.run_in_process([*args, "--topology-file", str(graph), "--out", str(run)], stop_after_first_round=True)
    assert cut.returncode == 130, cut.stderr
    graph.write_text(graph.read_text() + "0 3\n")
    changed = run_here("--resume", str(run), "--no-progress")
    assert changed.returncode == 2, changed.stderr
    assert f"--topology-file {graph} changed since the run started" in changed.stderr
    assert len(metric_lines(run)) == 1  # the folder as it was
    graph.write_text("".join(f"{i} {(i + 1) % 6}\n" for i in range(6)))
    assert run_here("--resume", str(run), "--no-progress").returncode == 0
    assert len(metric_lines(run)) == 2
    shards, run = tmp_path / "shards.json", tmp_path / "partitioned"
    shards.write_text(json.dumps([list(range(i * 30, i * 30 + 30)) for i in range(6)]))
    cut = testing.run_in_process(
        [*args, "--partition-file", str(shards), "--out", str(run)], stop_after_first_round=True
    )
    assert cut.returncode == 130, cut.stderr
    shards.write_text(json.dumps([list(range(i * 30, i * 30 + 29)) for i in range(6)]))
    changed = run_here("--resume", str(run), "--no-progress")
    assert changed.returncode == 2 and f"--partition-file {shards} changed since" in changed.stderr
