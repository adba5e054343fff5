"""Stopping and resuming never loses what is there: a resume that fails writes nothing, a damaged
newest checkpoint falls back to the previous slot, the command that started a run plus --resume is
accepted, and SIGTERM saves the last completed round."""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from p2pfl import testing
from tests.conftest import ROOT
from tests.test_resume import _start, _wait_for_rows

ARGS = [
    "--dataset",
    "synthetic",
    "--peers",
    "8",
    "--kappa",
    "3",
    "--rounds",
    "4",
    "--local-epochs",
    "2",
    "--samples-per-peer",
    "60",
    "--algo",
    "scaffold",
    "--clients-per-round",
    "5",
    "--no-progress",
]


def _stopped(tmp_path, name, rounds_done):
    """A run stopped by a Ctrl-C-style request after `rounds_done` rounds, one round at a time (each stop
    writes a checkpoint: after 2 rounds both slots hold one)."""
    out = tmp_path / name
    done = testing.run_in_process([*ARGS, "--out", str(out)], stop_after_first_round=True)
    code, err = done.returncode, done.stderr
    assert code == 130, err
    for _ in range(rounds_done - 1):
        done = testing.run_in_process(["--resume", str(out), "--no-progress"], stop_after_first_round=True)
        code, err = done.returncode, done.stderr
        assert code == 130, err
    return out


@pytest.fixture
def whole(tmp_path):
    done = testing.run_in_process([*ARGS, "--out", str(tmp_path / "whole")])
    code, err = done.returncode, done.stderr
    assert code == 0, err
    return tmp_path / "whole"


def _fingerprint(folder):
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _one_line(err):
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


class Foreign:
    """A pickle naming a class that is not a tensor or a plain container: loading it must not run it."""

    def __reduce__(self):
        return (os.system, (f"touch {os.environ['P2PFL_TEST_MARKER']}",))


def _damage(path, how, tmp_path):
    if how == "random bytes":
        path.write_bytes(os.urandom(300))
    elif how == "zero bytes":
        path.write_bytes(b"")
    elif how == "a plain tensor":
        torch.save(torch.zeros(3), path)
    elif how == "a foreign class":
        os.environ["P2PFL_TEST_MARKER"] = str(tmp_path / "ran")
        torch.save({"round": Foreign()}, path)  # torch.load without weights_only would run os.system
    elif how in LATEST_DAMAGE:
        path.write_text(LATEST_DAMAGE[how])


LATEST_DAMAGE = {
    "garbage": "{not json",
    "empty": "",
    "a list": "[1, 0, 1]",
    "a string round": '{"round": "2", "slot": 1, "ranks": 1}',
}
SLOT_DAMAGE = ["random bytes", "zero bytes", "a plain tensor", "a foreign class"]


@pytest.mark.parametrize("how", SLOT_DAMAGE)
def test_a_damaged_newest_slot_falls_back_to_the_previous_one(tmp_path, whole, how):
    run = _stopped(tmp_path, "cut", 2)
    latest = json.loads((run / "checkpoint" / "latest.json").read_text())
    _damage(run / "checkpoint" / f"slot{latest['slot']}-rank0-of1.pt", how, tmp_path)
    done = testing.run_in_process(["--resume", str(run), "--no-progress"])
    code, err = done.returncode, done.stderr
    assert code == 0, err
    assert "the newest checkpoint is damaged" in err and "after round 1" in err and "Traceback" not in err
    testing.assert_same_results(whole, run, f"resumed past a slot of {how}")
    assert not (tmp_path / "ran").exists()  # the foreign pickle's payload never ran


@pytest.mark.parametrize("how", list(LATEST_DAMAGE))
def test_a_damaged_latest_json_falls_back_to_the_newest_readable_slot(tmp_path, whole, how):
    run = _stopped(tmp_path, "cut", 2)
    _damage(run / "checkpoint" / "latest.json", how, tmp_path)
    done = testing.run_in_process(["--resume", str(run), "--no-progress"])
    code, err = done.returncode, done.stderr
    assert code == 0, err
    assert "latest.json" in err and "after round 2" in err
    testing.assert_same_results(whole, run, f"resumed past a latest.json of {how}")


@pytest.mark.parametrize("how", SLOT_DAMAGE)
def test_when_no_slot_can_be_read_the_resume_says_so_and_changes_nothing(tmp_path, how):
    run = _stopped(tmp_path, "cut", 2)
    for slot in (0, 1):
        _damage(run / "checkpoint" / f"slot{slot}-rank0-of1.pt", how, tmp_path)
    before = _fingerprint(run)
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
    done = testing.run_in_process(["--resume", str(run), "--no-progress"])
    code, err = done.returncode, done.stderr
    assert code == 2 and "no checkpoint can be read" in _one_line(err)
    assert _fingerprint(run) == before  # metrics.jsonl, config.toml and the rest as they were
    assert not (tmp_path / "ran").exists()


def test_a_config_toml_edited_since_is_one_line_and_changes_nothing(tmp_path):
    run = _stopped(tmp_path, "cut", 1)
    config = run / "config.toml"
    config.write_text(config.read_text().replace("peers = 8", "peers = 6"))
    before = _fingerprint(run)
    done = testing.run_in_process(["--resume", str(run), "--no-progress"])
    code, err = done.returncode, done.stderr
    assert code == 2 and "does not fit the run's config.toml" in _one_line(err)
    assert _fingerprint(run) == before


def test_the_starting_command_plus_resume_is_accepted(tmp_path, whole):
    run = _stopped(tmp_path, "cut", 1)
    done = testing.run_in_process([*ARGS, "--out", str(run), "--resume", str(run)])
    code, err = done.returncode, done.stderr
    assert code == 0, err
    testing.assert_same_results(whole, run, "the same command plus --resume")


def test_a_real_change_names_the_flag_and_both_values(tmp_path):
    run = _stopped(tmp_path, "cut", 1)
    before = _fingerprint(run)
    done = testing.run_in_process([*ARGS, "--lr", "0.05", "--resume", str(run)])
    code, err = done.returncode, done.stderr
    assert code == 2 and "--lr is 0.1 there, 0.05 here" in _one_line(err)
    done = testing.run_in_process(["--resume", str(run), "--rounds", "9"])
    code, err = done.returncode, done.stderr
    line = _one_line(err)
    assert code == 2 and "--rounds is 4 there, 9 here" in line and "start a new run" in line
    done = testing.run_in_process(["--resume", str(run), "--out", str(tmp_path / "elsewhere")])
    code, err = done.returncode, done.stderr
    assert code == 2 and "names another" in _one_line(err)
    assert _fingerprint(run) == before


def test_a_toml_resume_key_follows_the_same_rules(tmp_path, whole):
    run = _stopped(tmp_path, "cut", 1)
    before = _fingerprint(run)
    changed = tmp_path / "changed.toml"
    changed.write_text(f'resume = "{run}"\nlr = 0.5\n')
    done = testing.run_in_process(["--config", str(changed)])
    code, err = done.returncode, done.stderr
    assert code == 2 and "--lr is 0.1 there, 0.5 here" in _one_line(err)
    assert _fingerprint(run) == before
    same = tmp_path / "same.toml"
    same.write_text(f'resume = "{run}"\nlr = 0.1\nprogress = false\n')
    done = testing.run_in_process(["--config", str(same)])
    code, err = done.returncode, done.stderr
    assert code == 0, err
    testing.assert_same_results(whole, run, "resumed through a TOML resume key")


SLOW = [
    "--dataset",
    "synthetic",
    "--peers",
    "12",
    "--kappa",
    "3",
    "--rounds",
    "5",
    "--local-epochs",
    "300",
    "--algo",
    "dfedavg",
    "--no-progress",
    "--checkpoint-every",
    "0",
]  # long rounds, no checkpoint of its own


@pytest.mark.parametrize(
    "ranks",
    [
        pytest.param(0, marks=pytest.mark.subprocess, id="one process"),
        pytest.param(3, marks=pytest.mark.mpi, id="mpirun -n 3"),
    ],
)
def test_sigterm_saves_the_last_completed_round_and_the_resume_equals_the_whole_run(tmp_path, ranks):
    """SIGTERM to every process (as SLURM sends it to a job's tasks) after round 2, with no checkpoint
    written by then: the run saves round 2 from memory, exits 143, and resumes to the whole run's numbers."""
    run = tmp_path / "cut"
    proc = _start(SLOW, run, ranks)
    _wait_for_rows(proc, run, 2)
    if ranks:
        pids = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        for pid in pids:
            os.kill(int(pid), signal.SIGTERM)
    else:
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "checkpoint after round 2; continue with" in err and "Traceback" not in err
    assert json.loads((run / "checkpoint" / "latest.json").read_text())["round"] == 2
    again = [*SLOW, "--out", str(run), "--resume", str(run)]  # the same command plus --resume
    resumed = testing.run_in_process(again)  # on one process whatever stopped (any layout resumes it)
    assert resumed.returncode == 0, resumed.stderr
    done = testing.run_in_process([*SLOW, "--out", str(tmp_path / "whole")])
    code, err = done.returncode, done.stderr
    assert code == 0, err
    testing.assert_same_results(tmp_path / "whole", run, "stopped by SIGTERM and resumed")


@pytest.mark.mpi
@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 143), (signal.SIGHUP, 129)], ids=["Ctrl-C", "SIGHUP"])
def test_ctrl_c_at_the_terminal_reaches_launch_mpiruns_ranks_and_saves(tmp_path, signum, code):
    """mpirun answers SIGINT and SIGTERM by killing its ranks at once, without a word, but forwards
    SIGUSR1: launch/mpirun.sh runs mpirun in a session of its own, so that a terminal's Ctrl-C (SIGINT to
    the foreground process group) reaches the script alone, and turns it (and a SIGTERM, the same trap)
    into SIGUSR1. The ranks save the last completed round and exit 143, within seconds. A closed terminal
    (SIGHUP to the group) killed the script alone, and the ranks, in their own session, ran on to the end:
    it is passed on, and the ranks exit 129."""
    run = tmp_path / "cut"

    def terminal():  # as a shell's foreground job: the test's own run may ignore them (nohup ignores SIGHUP,
        for sig in (signal.SIGINT, signal.SIGHUP):  # and bash cannot trap a signal ignored when it started)
            signal.signal(sig, signal.SIG_DFL)

    proc = subprocess.Popen(
        ["bash", str(ROOT / "launch" / "mpirun.sh"), "3", *SLOW, "--out", str(run)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=terminal,
    )
    _wait_for_rows(proc, run, 2)
    os.killpg(proc.pid, signum)
    start = time.monotonic()
    _, err = proc.communicate(timeout=120)
    assert time.monotonic() - start < 10, err
    assert proc.returncode == code, err
    assert "checkpoint after round" in err and "continue with" in err, err
    assert subprocess.run(["pgrep", "-f", str(run)], capture_output=True).stdout == b""  # no rank runs on
    assert (run / "checkpoint" / "latest.json").exists(), err
    assert json.loads((run / "checkpoint" / "latest.json").read_text())["round"] >= 2


@pytest.mark.parametrize(
    "console,signum,code",
    [(False, signal.SIGINT, 130), (True, signal.SIGINT, 130), (True, signal.SIGUSR1, 143)],
    ids=["python -m p2pfl.run, Ctrl-C", "p2pfl-run, Ctrl-C", "p2pfl-run, SIGUSR1"],
)
@pytest.mark.subprocess
def test_a_stop_while_starting_is_one_line(tmp_path, console, signum, code):
    """While torch loads (0.3 s in), from the module and from the console script, which once lost a
    Ctrl-C there (the run went on to its end) and died of SIGUSR1 without a word."""
    import sys
    from pathlib import Path

    script = Path(sys.executable).parent / "p2pfl-run"
    if console:
        proc = subprocess.Popen(
            [str(script), "--dataset", "synthetic", "--out", str(tmp_path / "r")],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    else:
        proc = _start(["--dataset", "synthetic"], tmp_path / "r")
    time.sleep(0.3)  # torch is loading
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code and "Traceback" not in err and len(err.strip().splitlines()) <= 1, err


def _sigterm_when(event: threading.Event, sent: list) -> threading.Thread:
    """A thread that sends this process SIGTERM once `event` is set (the run says it is in the middle of
    its compute), noting when."""

    def send():
        event.wait()
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def _stopped_in_round_two_then_resumed(tmp_path, args, monkeypatch, patch):
    """The run with `patch` (which sets the event it is given inside round 2's compute, then computes for
    minutes unless the stop ends it) is stopped by SIGTERM within 10 s, saves round 1 from memory, and
    its resume (unpatched) equals the whole run."""
    event, sent = threading.Event(), []
    patch(event)
    _sigterm_when(event, sent)
    stopped = testing.run_in_process([*args, "--out", str(tmp_path / "cut")])
    took = time.monotonic() - sent[0]
    monkeypatch.undo()
    assert stopped.returncode == 143, stopped.stderr[-2000:]
    assert took < 10, f"the stop took {took:.1f} s"
    assert "stopped in round 2 by SIGTERM" in stopped.stderr and "checkpoint after round 1" in stopped.stderr
    resumed = testing.run_in_process(["--resume", str(tmp_path / "cut"), "--no-progress"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    whole = testing.run_in_process([*args, "--out", str(tmp_path / "whole")])
    assert whole.returncode == 0, whole.stderr[-2000:]
    testing.assert_same_results(tmp_path / "whole", tmp_path / "cut", "stopped mid-round by SIGTERM and resumed")


def test_sigterm_in_the_middle_of_the_kernel_evolution_stops_within_seconds(tmp_path, monkeypatch):
    """Round 2's first evolution is given 10 million units to integrate (minutes in the compiled loop,
    which Python's signal handler cannot enter): the stop ends it within a step."""
    import numpy as np

    from p2pfl.ntk import split_loop

    def patch(event):
        real, calls = split_loop.left_sums, []

        def long_in_round_two(*args):
            calls.append(1)
            if len(calls) <= 4:  # round 1: one evolution a peer
                return real(*args)
            wanted = np.full(10_000_000, -1, dtype=np.int64)
            wanted[: len(args[8])] = args[8]
            event.set()
            return real(*args[:8], wanted, *args[9:])

        monkeypatch.setattr(split_loop, "left_sums", long_in_round_two)

    args = [
        "--algo",
        "ntk-dfl",
        "--dataset",
        "synthetic",
        "--peers",
        "4",
        "--kappa",
        "2",
        "--rounds",
        "3",
        "--samples-per-peer",
        "20",
        "--ntk-taus",
        "50,100",
        "--lr",
        "0.1",
        "--checkpoint-every",
        "0",
        "--no-progress",
    ]
    _stopped_in_round_two_then_resumed(tmp_path, args, monkeypatch, patch)


def test_sigterm_in_the_middle_of_local_training_stops_within_seconds(tmp_path, monkeypatch):
    """Round 2's block of local training is given 100,000 epochs (minutes, in a pool thread the main
    thread waits for): the stop ends it within a step."""
    import dataclasses

    from p2pfl.local import training

    def patch(event):
        real = training._train_block

        def long_in_round_two(stack, flat, shards, peers, train_x, train_y, opt, lr, seed, round_index, terms):
            if round_index == 1:
                event.set()
                opt = dataclasses.replace(opt, epochs=100_000)
            return real(stack, flat, shards, peers, train_x, train_y, opt, lr, seed, round_index, terms)

        monkeypatch.setattr(training, "_train_block", long_in_round_two)

    args = [
        "--algo",
        "dfedavg",
        "--dataset",
        "synthetic",
        "--peers",
        "6",
        "--kappa",
        "2",
        "--rounds",
        "3",
        "--local-epochs",
        "2",
        "--checkpoint-every",
        "0",
        "--no-progress",
    ]
    _stopped_in_round_two_then_resumed(tmp_path, args, monkeypatch, patch)


def _link_metrics_outside(run, tmp_path):
    outside = tmp_path / "outside.jsonl"
    outside.write_text((run / "metrics.jsonl").read_text())
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").symlink_to(outside)
    return outside


def _hard_link_metrics_outside(run, tmp_path):
    outside = tmp_path / "outside.jsonl"
    os.link(run / "metrics.jsonl", outside)
    return outside


def _pipe_for_latest(run, tmp_path):
    (run / "checkpoint" / "latest.json").unlink()
    os.mkfifo(run / "checkpoint" / "latest.json")


def _folder_for_a_slot(run, tmp_path):
    slot = json.loads((run / "checkpoint" / "latest.json").read_text())["slot"]
    newest = next((run / "checkpoint").glob(f"slot{slot}-*.pt"))
    newest.unlink()
    newest.mkdir()


@pytest.mark.parametrize(
    "damage,needle",
    [
        (_link_metrics_outside, "metrics.jsonl is a link; a run writes only inside its folder"),
        (_hard_link_metrics_outside, "metrics.jsonl has another name (a hard link, 2 names in all)"),
        (_pipe_for_latest, "checkpoint/latest.json is not a file"),
        (_folder_for_a_slot, "is not a file (remove it to resume from the other checkpoint)"),
    ],
    ids=[
        "metrics.jsonl a link outside",
        "metrics.jsonl hard-linked outside",
        "latest.json a named pipe",
        "the newest slot a folder",
    ],
)
def test_a_resume_refused_for_its_files_changes_nothing(tmp_path, damage, needle):
    """Hostile cases of issue 40: the resume followed a link out of the folder (the outside file got the
    rows), hung on a pipe, or rewrote the metrics and plot before failing on a slot that is a folder. Each
    is refused in one line before anything is written."""
    run = _stopped(tmp_path, "run", 2)
    outside = damage(run, tmp_path)
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file() and not p.is_symlink()}
    done = testing.run_in_process(["--resume", str(run), "--no-progress"])
    assert done.returncode == 2 and needle in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file() and not p.is_symlink()} == before
    if outside is not None:
        assert len(outside.read_text().splitlines()) == 2


@pytest.mark.parametrize(
    "make",
    [lambda t: Path("/dev/zero"), lambda t: os.mkfifo(t / "pipe.toml") or t / "pipe.toml"],
    ids=["/dev/zero", "a named pipe"],
)
def test_a_config_that_is_not_a_regular_file_is_refused_not_read(tmp_path, make):
    done = testing.run_in_process(["--config", str(make(tmp_path))])
    assert done.returncode == 2 and "is not a regular file" in done.stderr, done.stderr


def test_a_run_folder_in_use_is_refused_to_a_second_run(tmp_path, monkeypatch):
    """Hostile case of issue 40: a sweep into a folder a running run was writing wrote into it too (rounds
    repeated in metrics.jsonl). The run holds a lock on its folder; a second run there (an --overwrite, a
    resume, as a sweep starts them) is refused in one line, and the first goes on undisturbed."""
    from p2pfl.runner import round_row as measure

    run = tmp_path / "run"
    args = [
        "--dataset",
        "synthetic",
        "--peers",
        "6",
        "--kappa",
        "2",
        "--rounds",
        "3",
        "--local-epochs",
        "1",
        "--no-progress",
        "--out",
        str(run),
    ]
    seen, real = [], measure.RoundMeasure.record

    def record(self, k, *rest):  # rounds 1 and 2 done: a second run into the folder, while the first holds it
        if k in (0, 1):
            seen.append(testing.run_in_process([*args, "--overwrite"]))
        return real(self, k, *rest)

    monkeypatch.setattr(measure.RoundMeasure, "record", record)
    first = testing.run_in_process(args)
    assert first.returncode == 0, first.stderr[-2000:]
    assert all(s.returncode == 2 and "is in use: a run is writing it now" in s.stderr for s in seen), seen[-1].stderr
    assert [json.loads(line)["round"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    monkeypatch.undo()
    again = testing.run_in_process([*args, "--overwrite"])  # the lock went with the run
    assert again.returncode == 0, again.stderr[-2000:]


@pytest.mark.subprocess
@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGQUIT])
def test_sighup_and_sigquit_save_the_last_round_as_sigterm_does(tmp_path, signum):
    """Hostile case of issue 50: SIGHUP (a closed terminal) and SIGQUIT killed the run without saving."""
    run = tmp_path / "cut"
    proc = _start(SLOW, run, 0)
    _wait_for_rows(proc, run, 2)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, err
    assert "checkpoint after round" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert json.loads((run / "checkpoint" / "latest.json").read_text())["round"] >= 2


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGTERM])
def test_a_stop_as_a_rounds_row_is_written_saves_that_round(tmp_path, monkeypatch, signum):
    """Issue 62: once, SIGHUP just after round 2's row reached metrics.jsonl saved round 1 (the row was
    written before the round was captured for a stop). Here the signal lands exactly there, every time."""
    from p2pfl.measure import metrics

    write = metrics.append_line

    def signalled_at_round_2(path, line):
        write(path, line)
        if json.loads(line)["round"] == 2:
            os.kill(os.getpid(), signum)  # its handler runs before this returns

    monkeypatch.setattr(metrics, "append_line", signalled_at_round_2)
    run = tmp_path / "cut"
    done = testing.run_in_process([*ARGS, "--checkpoint-every", "0", "--out", str(run)])
    assert done.returncode == 128 + signum, done.stderr
    assert "checkpoint after round 2" in done.stderr, done.stderr
    assert json.loads((run / "checkpoint" / "latest.json").read_text())["round"] == 2
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2


@pytest.mark.subprocess
def test_a_second_signal_during_a_stop_still_ends_with_the_line_and_the_save(tmp_path):
    """Hostile case of issue 50: a second SIGTERM while the run stopped ended it without a word."""
    run = tmp_path / "cut"
    proc = _start(SLOW, run, 0)
    _wait_for_rows(proc, run, 2)
    proc.send_signal(signal.SIGTERM)
    for _ in range(20):  # an impatient scheduler: again and again while the stop saves and exits
        time.sleep(0.02)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "checkpoint after round" in err, err
    assert json.loads((run / "checkpoint" / "latest.json").read_text())["round"] >= 2


CUT = [
    "--dataset",
    "synthetic",
    "--peers",
    "4",
    "--kappa",
    "2",
    "--rounds",
    "3",
    "--samples-per-peer",
    "20",
    "--local-epochs",
    "1",
    "--test-samples",
    "50",
    "--no-progress",
]


def test_a_checkpoint_copied_from_another_run_is_refused_naming_what_differs(tmp_path):
    """Hostile case of issue 50: another seed's checkpoint was resumed without a word."""
    for name, seed in (("mine", "0"), ("theirs", "1")):
        cut = testing.run_in_process([*CUT, "--seed", seed, "--out", str(tmp_path / name)], stop_after_first_round=True)
        assert cut.returncode == 130, cut.stderr
    shutil.rmtree(tmp_path / "mine" / "checkpoint")
    shutil.copytree(tmp_path / "theirs" / "checkpoint", tmp_path / "mine" / "checkpoint")
    before = (tmp_path / "mine" / "metrics.jsonl").read_text()
    done = testing.run_in_process(["--resume", str(tmp_path / "mine"), "--no-progress"])
    assert (
        done.returncode == 2 and "does not fit the run's config.toml: it was written with seed 1, not 0" in done.stderr
    )
    assert (tmp_path / "mine" / "metrics.jsonl").read_text() == before  # nothing changed


def test_rounds_lowered_by_hand_below_the_checkpoint_is_refused_and_keeps_the_checkpoint(tmp_path):
    """Hostile case of issue 50: --resume exited 0, deleted the checkpoint and wrote no model."""
    run = tmp_path / "run"
    assert testing.run_in_process([*CUT, "--out", str(run)], stop_after_first_round=True).returncode == 130
    config = run / "config.toml"
    config.write_text(config.read_text().replace("\nrounds = 3\n", "\nrounds = 1\n"))
    done = testing.run_in_process(["--resume", str(run), "--no-progress"])
    assert done.returncode == 2 and "nothing is left to run (was rounds lowered by hand?" in done.stderr, done.stderr
    assert (run / "checkpoint" / "latest.json").is_file()


@pytest.mark.subprocess
def test_a_stop_during_numbas_first_compile_ends_within_10_s(tmp_path):
    """Hostile case of issue 50: SIGTERM while numba compiled the NTK loop took 143 s (no handler runs
    inside the compiler). With an empty numba cache the run compiles in a child that a stop ends."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}  # nothing compiled there yet
    cmd = [
        sys.executable,
        "-m",
        "p2pfl.run",
        "--algo",
        "ntk-dfl",
        "--dataset",
        "synthetic",
        "--peers",
        "4",
        "--kappa",
        "2",
        "--rounds",
        "1",
        "--ntk-taus",
        "50,100",
        "--no-progress",
        "--out",
        str(tmp_path / "run"),
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()
    while line and "compiling the NTK integrator loop" not in line:
        line = proc.stderr.readline()
    assert line, "the run did not compile ahead"
    time.sleep(1.0)  # inside the compile
    proc.send_signal(signal.SIGTERM)
    start = time.monotonic()
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - start < 10 and proc.returncode == 143, err
    assert err.strip().splitlines() == ["p2pfl: stopped before the run started"], err
    left = subprocess.run(["pgrep", "-f", "p2pfl.ntk.precompile"], capture_output=True, text=True).stdout.split()
    assert not [pid for pid in left if _parent(pid) == proc.pid], "the compiling child outlived the run"


def _parent(pid: str) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def _rank_pids(marker: str) -> dict[int, int]:
    """{MPI rank: pid} of the processes whose command line holds marker."""
    out = {}
    for pid in subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split():
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        ranks = [e.split(b"=", 1)[1] for e in env if e.startswith(b"OMPI_COMM_WORLD_RANK=")]
        if ranks:
            out[int(ranks[0])] = int(pid)
    return out


@pytest.mark.mpi
def test_sigterm_to_one_rank_of_launch_mpirun_while_it_starts_ends_the_job(tmp_path):
    """Hostile case of issue 50: SIGTERM to one rank of `launch/mpirun.sh 3` while the job was still starting
    hung it silently, also with --comm-timeout 20 (the others waited for that rank at start-up)."""
    marker = str(tmp_path / "run")  # in the ranks' command lines
    proc = subprocess.Popen(
        ["bash", str(ROOT / "launch" / "mpirun.sh"), "3", *SLOW, "--comm-timeout", "20", "--out", marker],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while len(ranks := _rank_pids(marker)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(ranks) == 3, ranks
    os.kill(ranks[2], signal.SIGTERM)  # while torch loads, before any collective
    start = time.monotonic()
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - start < 10, err
    assert proc.returncode == 143 and err.strip().splitlines() == ["p2pfl: stopped before the run started"], err


@pytest.mark.parametrize("landing", ["slot", "latest.json"])
def test_a_stop_during_the_first_checkpoint_write_saves_the_finished_round(tmp_path, monkeypatch, landing):
    """Issue 50 asks that a stop landing inside a checkpoint write keep the finished round (or the previous
    checkpoint, named): SIGTERM inside the first write, of a slot file or of latest.json, saves round 1."""
    from p2pfl.runner.checkpoint import files as checkpoint

    real, sent = checkpoint.atomic_write, []

    def signalled(path, write):
        if path.name.startswith(landing) and not sent:
            sent.append(path.name)
            os.kill(os.getpid(), signal.SIGTERM)  # its handler raises inside this write
        return real(path, write)

    monkeypatch.setattr(checkpoint, "atomic_write", signalled)
    run = tmp_path / "run"
    cut = testing.run_in_process([*CUT, "--rounds", "3", "--checkpoint-every", "1", "--out", str(run)])
    assert sent and cut.returncode == 143 and "checkpoint after round 1" in cut.stderr, cut.stderr
    monkeypatch.setattr(checkpoint, "atomic_write", real)
    assert json.loads((run / "checkpoint" / "latest.json").read_text())["round"] == 1
    resumed = testing.run_in_process(["--resume", str(run), "--no-progress"])
    whole = testing.run_in_process([*CUT, "--rounds", "3", "--out", str(tmp_path / "whole")])
    assert resumed.returncode == 0 and whole.returncode == 0, resumed.stderr
    testing.assert_same_results(tmp_path / "whole", run, "stopped inside a checkpoint write and resumed")
