"""A stop that does not wait for compute.

A signal that stops a run at once (SIGTERM, SIGUSR1, a second Ctrl-C) is handled by Python in the main
thread, between bytecodes: not while that thread runs a compiled loop (the NTK integrator) or waits for
a pool of threads to finish their block of local training. NOW is set as soon as such a signal arrives,
by a thread that watches the signal wakeup file descriptor, and the long loops read it: the compiled
integrator (an array it can read) and local training's steps. They end early, the main thread gets back
to Python, and the handler there saves the last completed round and exits. What they leave half done
belongs to a round that is thrown away.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from pathlib import Path

import numpy as np

NOW = np.zeros(1, np.int8)  # 1: stop at once (read by compiled loops, hence an array)
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
