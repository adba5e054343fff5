"""A stop that does not wait for compute.

A signal that stops a run at once (SIGTERM, SIGUSR1, a second Ctrl-C) is handled by Python in the main
thread, between bytecodes: not while that thread runs a compiled loop (the NTK integrator) or waits for
a pool of threads to finish their block of local training. NOW is set as soon as such a signal arrives,
by a thread that watches the signal wakeup file descriptor, and the long loops read it: the compiled
integrator (an array it can read) and local training's steps. They end early, the main thread gets back
to Python, and the handler there saves the last completed round and exits. What they leave half done
belongs to a round that is thrown away.

Everything that stops a run is here: the flag the long loops read, the watcher that sets it, the CLI's
handlers before the run starts, and the run's own (StopRequest: finish the round, or stop at once).
What a stop saves is p2pfl.runner.checkpoint.policy's.
"""

from __future__ import annotations

import _thread
import os
import signal
import socket
import sys
import threading
from pathlib import Path


# 1: stop at once. A byte buffer, which compiled loops read through a numpy view (np.frombuffer): this
# module imports no numpy, so the CLI's first handlers are in place before anything slow loads.
NOW = bytearray(1)
LOOP_STARTED = [False]  # a round loop has begun in this process (it handles signals from then on)
# a first SIGINT finishes the round; a second one is at once, as these are (SIGHUP: the terminal closed)
AT_ONCE = (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP, signal.SIGQUIT)
CHILDREN: list = []  # processes the run started and waits for (numba's compile ahead): a stop ends them too
CLI = [False]  # this process is the command line's (p2pfl.run): nothing after a stop may kill it silently


def requested() -> bool:
    return bool(NOW[0])


def check() -> None:
    """In a long loop: end it (KeyboardInterrupt, as the handler raises) when a stop at once came."""
    if NOW[0]:
        raise KeyboardInterrupt


class SignalWatcher:
    """Sets NOW when a stop-at-once signal arrives, whatever the main thread is doing. Python's own
    handler still runs (and decides what the stop does) once the main thread is back in Python; this only
    learns early, through signal.set_wakeup_fd, which the main thread must call (it does, in __init__)."""

    def __init__(self):
        NOW[0] = 0
        self._read, self._write = socket.socketpair()
        self._write.setblocking(False)
        self._previous = signal.set_wakeup_fd(self._write.fileno(), warn_on_full_buffer=False)
        self._interrupts = 0
        threading.Thread(target=self._watch, name="p2pfl-stop-watcher", daemon=True).start()

    def _watch(self) -> None:
        while True:
            try:
                got = self._read.recv(64)
            except OSError:
                return
            if not got:  # closed
                return
            for signum in got:
                self._interrupts += signum == signal.SIGINT
                if signum in AT_ONCE or self._interrupts >= 2:
                    NOW[0] = 1

    def close(self) -> None:
        signal.set_wakeup_fd(self._previous)
        self._write.close()
        self._read.close()
        NOW[0] = 0


def record_status(code: int) -> None:
    """The exit status into $P2PFL_STATUS_FILE where launch/mpirun.sh set it: it runs mpirun without its
    banner for a rank's non-zero status, and so without the status itself."""
    path = os.environ.get("P2PFL_STATUS_FILE")
    if path:
        try:
            Path(path).write_text(f"{code}\n")
        except OSError:
            pass


def quiet_until_started() -> None:
    """The CLI's handlers from its first line (`python -m p2pfl.run` and the p2pfl-run console script):
    a stop while torch loads, before the run can save anything, or after the loop (what mpirun sends the
    other ranks when one has stopped), ends in one line, not a traceback; the run installs its own when
    it starts. A write past a file-size limit fails (EFBIG) instead of killing the process."""
    for signum in (signal.SIGINT, *AT_ONCE):
        signal.signal(signum, _stopped_early)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def _stopped_early(signum, frame) -> None:
    code = 143 if signum == signal.SIGUSR1 else 128 + signum  # SIGUSR1 is a stop forwarded by mpirun, as SIGTERM
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK"))
    rank0, under_mpi = rank in (None, "0"), rank is not None  # one line for the job
    for child in CHILDREN:
        child.kill()
    if not LOOP_STARTED[0] and rank0:
        os.write(2, b"p2pfl: stopped before the run started\n")
        record_status(code)
    if signum != signal.SIGUSR1 and under_mpi:
        # A signal to one rank alone (its node's, or a user's kill): end by that signal, which mpirun takes
        # as the job's failure and ends the other ranks, instead of an exit status it may be told to
        # ignore (launch/mpirun.sh), where they would wait for this rank at start-up for ever.
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    os._exit(code)


class StopRequest:
    """Ctrl-C asks the run to finish its round, write a checkpoint and stop (exit 130); a second Ctrl-C,
    or SIGTERM (a scheduler's stop or preemption; what mpirun sends the other ranks when one dies), stops
    at once and saves the last completed round from memory (exit 143 for SIGTERM)."""

    def __init__(self, rank: int, announce=None):
        """announce(why): tell the other ranks of a stop at once (the transport's announce_stop); a rank
        that hears one calls on_remote_stop (the transport's watch_for_stops, started by the caller where
        handles_signals)."""
        LOOP_STARTED[0] = True
        self.requested, self.rank, self.by, self.now, self.remote = False, rank, "Ctrl-C", False, None
        self.code = 130  # the exit status of the stop: 128 + the signal's number (Ctrl-C: 130, SIGTERM: 143)
        self.announce = announce
        self.handles_signals = threading.current_thread() is threading.main_thread()  # only it may set handlers
        self.previous = (
            {s: signal.signal(s, self.on_signal) for s in (signal.SIGINT, *AT_ONCE)} if self.handles_signals else {}
        )
        self.watcher = SignalWatcher() if self.handles_signals else None  # the long loops learn at once

    def on_remote_stop(self, why: str) -> None:
        """Another rank stopped at once (its node preempted): this one does too, as if signalled, so that
        the ranks save the last round they all hold instead of waiting for the stopped one's messages."""
        if not self.now:
            self.remote = why
            NOW[0] = 1
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
            NOW[0] = 1
            if self.announce is not None and not self.remote:
                self.announce(f"a stop of rank {self.rank}: {self.by}")
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
        stopping_now = self.now or self.requested
        for s, handler in self.previous.items():
            signal.signal(s, signal.SIG_IGN if stopping_now and CLI[0] else handler)
        if self.watcher is not None:
            self.watcher.close()
