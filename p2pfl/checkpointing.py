"""When a run writes a checkpoint and how it stops: the ranks agree after every round whether a checkpoint
is due (--checkpoint-every, or CHECKPOINT_SECONDS since the last) or a stop was asked for (Ctrl-C), and a
stop at once (SIGTERM, a second Ctrl-C, another rank's) saves the last round every rank holds in memory."""

from __future__ import annotations

import _thread
import signal
import sys
import threading
import time
from pathlib import Path

from p2pfl import checkpoint, stopping
from p2pfl.config import CHECKPOINT_SECONDS
from p2pfl.errors import Interrupted
from p2pfl.run_folder import resume_hint

# Seconds a stop by signal waits for the other ranks while it saves: every rank signalled leaves its
# compute within a step (p2pfl.stopping), so they meet within a second or two; a dead rank is what the
# wait gives up on. The whole stop stays within 10 s. launch/slurm.sh asks for the signal 90 s before the limit.
EMERGENCY_TIMEOUT = 5.0


class StopRequest:
    """Ctrl-C asks the run to finish its round, write a checkpoint and stop (exit 130); a second Ctrl-C,
    or SIGTERM (a scheduler's stop or preemption; what mpirun sends the other ranks when one dies), stops
    at once and saves the last completed round from memory (exit 143 for SIGTERM)."""

    def __init__(self, rank: int, transport=None):
        stopping.LOOP_STARTED[0] = True
        self.requested, self.rank, self.by, self.now, self.remote = False, rank, "Ctrl-C", False, None
        self.code = 130  # the exit status of the stop: 128 + the signal's number (Ctrl-C: 130, SIGTERM: 143)
        self.transport = transport
        in_main_thread = threading.current_thread() is threading.main_thread()  # only it may set handlers
        self.previous = (
            {s: signal.signal(s, self.on_signal) for s in (signal.SIGINT, *stopping.AT_ONCE)} if in_main_thread else {}
        )
        self.watcher = stopping.SignalWatcher() if in_main_thread else None  # the long loops learn at once
        if in_main_thread and transport is not None:
            transport.watch_for_stops(self.on_remote_stop)

    def on_remote_stop(self, why: str) -> None:
        """Another rank stopped at once (its node preempted): this one does too, as if signalled, so that
        the ranks save the last round they all hold instead of waiting for the stopped one's messages."""
        if not self.now:
            self.remote = why
            stopping.NOW[0] = 1
            _thread.interrupt_main(signal.SIGUSR1)

    def on_signal(self, signum, frame) -> None:
        if self.now:  # already stopping at once: let it save what it holds
            return
        self.code = 143 if signum == signal.SIGUSR1 else 128 + signum  # SIGUSR1: a stop forwarded, as SIGTERM
        if signum == signal.SIGTERM:
            self.by = "SIGTERM (a scheduler's stop; under mpirun also when a rank died)"
        elif signum == signal.SIGHUP:
            self.by = "SIGHUP (its terminal closed)"
        elif signum == signal.SIGQUIT:
            self.by = "SIGQUIT"
        elif signum == signal.SIGUSR1 and self.remote:
            self.by = self.remote
        elif signum == signal.SIGUSR1:  # mpirun forwards it to every rank, where SIGTERM ends the job at once
            self.by = "SIGUSR1 (a stop forwarded by mpirun)"
        if self.requested or signum != signal.SIGINT:
            self.now = True
            stopping.NOW[0] = 1
            if self.transport is not None and not self.remote:
                self.transport.announce_stop(f"a stop of rank {self.rank}: {self.by}")
            raise KeyboardInterrupt
        self.requested = True
        if self.rank == 0:
            print(
                "\np2pfl: interrupted: finishing this round, then a checkpoint (Ctrl-C again stops at once)",
                file=sys.stderr,
            )

    def uninstall(self) -> None:
        """The handlers as they were; on the command line, after a stop, further signals are ignored
        instead: the process is about to print its one line and exit, and a second signal (an impatient
        Ctrl-C, a scheduler's repeated SIGTERM) must not end it without that line."""
        if self.transport is not None:
            self.transport.stop_watching()
        stopping_now = self.now or self.requested
        for s, handler in self.previous.items():
            signal.signal(s, signal.SIG_IGN if stopping_now and stopping.CLI[0] else handler)
        if self.watcher is not None:
            self.watcher.close()


class Checkpoints:
    """A run's checkpoints: written when due or asked for, after a round whose state is resumable; the
    last completed rounds held in memory for a stop at once (write=False: none of either)."""

    def __init__(self, ctx, algorithm, run_dir: Path | None, write: bool, saved: int):
        self.ctx, self.algorithm, self.run_dir, self.write = ctx, algorithm, run_dir, write
        self.saved, self.last_save = saved, time.monotonic()
        self.held: list[dict] = []  # in-memory captures of the last completed rounds: what a stop at once saves

    def after_round(self, k: int, rows: list[dict], resumable: bool, stop_requested: bool) -> None:
        """After round k's row: every rank takes the same turn (a checkpoint, a stop: Interrupted)."""
        ctx, done = self.ctx, k + 1
        due = checkpoint_due(ctx.cfg.checkpoint_every, done, time.monotonic() - self.last_save)
        stop, due = ctx.transport.agree(stop_requested, due)
        if (due or stop) and self.write and resumable:
            checkpoint.save(ctx, self.algorithm, rows, done, self.run_dir)
            self.saved, self.last_save = done, time.monotonic()
        if stop:
            raise Interrupted(f"stopped after round {done}; {resume_hint(self.run_dir, self.saved)}")

    def hold(self, k: int, rows: list[dict], resumable: bool) -> None:
        """Capture round k in memory for a stop at once, as soon as its row is recorded and before the row is
        written anywhere: a round whose row a user sees is one a stop saves."""
        done = k + 1
        if self.write and resumable and done > self.saved:
            # ranks may be a collective apart when a signal lands: under MPI keep two rounds
            kept = self.held[-1:] if self.ctx.transport.size > 1 else []
            self.held = [*kept, checkpoint.capture(self.ctx, self.algorithm, rows, done)]

    def save_held(self) -> int:
        """After a stop at once: write the newest round every rank holds a capture of, if it is newer
        than the last checkpoint; returns the round the run folder now has a checkpoint of. Under MPI the
        ranks first agree on that round, waiting a few seconds at most: a rank that died (mpirun sends
        SIGTERM to the others then) leaves the previous checkpoint as it was."""
        transport, timeout = self.ctx.transport, self.ctx.transport.timeout
        transport.timeout = min(timeout, EMERGENCY_TIMEOUT)
        try:
            with transport.emergency():  # apart from a collective the signal cut short
                rounds = transport.gather([state["round"] for state in self.held])
                common = transport.bcast(
                    max(set.intersection(*map(set, rounds)), default=0) if rounds is not None else None
                )
                if common <= self.saved:
                    return self.saved
                checkpoint.write(next(s for s in self.held if s["round"] == common), self.run_dir, transport)
                transport.barrier()  # latest.json is written before any rank exits (mpirun ends the job at the first)
                self.saved = common
                return common
        except Exception as exc:  # noqa: BLE001 - a dead rank, a full disk, a collective cut by the signal
            if transport.rank == 0:
                print(f"p2pfl: the last rounds could not be saved ({exc.__class__.__name__}: {exc})", file=sys.stderr)
            return self.saved
        finally:
            transport.timeout = timeout


def checkpoint_due(every: int | None, rounds_done: int, since_last: float) -> bool:
    if every is None:
        return since_last >= CHECKPOINT_SECONDS
    return every > 0 and rounds_done % every == 0
