"""MPI transport (mpi4py): one contiguous byte buffer per (sending rank, receiving rank) and phase.

Each buffer holds a small int64 header (who sent what to whom, dtypes, shapes) and the raw tensor
bytes: no pickling on the hot path. Messages carry a tag made from (round, phase); receives poll
with Iprobe so a missing peer ends in a CommTimeout that names it instead of a silent hang. The
bookkeeping collectives (gather to rank 0, broadcast from it) are point-to-point messages polled
the same way, so a rank that dies or stalls stops the others there too, within --comm-timeout.
Under `mpirun --with-ft ulfm` a dead rank is reported by MPI itself, at once.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections import defaultdict
from contextlib import contextmanager

import numpy as np
import torch

from p2pfl.comm.transport import CommTimeout, Message, Placement, Transport

_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
]
_CODE = {dt: i for i, dt in enumerate(_DTYPES)}
_ALIGN = 8


def _tag(phase: str, round_index: int) -> int:
    return (round_index % 1000) * 32 + zlib.crc32(phase.encode()) % 32  # < 32000


COLLECTIVE_TAG = 32001  # above every exchange tag, within MPI's guaranteed bound 32767
NOTICE_TAG = 32002  # a rank that gave up tells the reporting rank, which prints the one line
EMERGENCY_TAG = 32003  # the collectives of a stop by signal, apart from any it cut short
STOP_TAG = 32004  # a rank stopped by a signal tells the others (MPI's thread level is THREAD_MULTIPLE)
STOP_POLL = 0.1  # seconds between a watching thread's looks for it
NOTICE_GRACE = 10.0  # seconds a rank that sent a notice waits for the reporter to end the job


def _raw(t: torch.Tensor) -> np.ndarray:
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().reshape(-1).view(np.uint8)


def pack(messages: list[Message]) -> np.ndarray:
    header: list[int] = [len(messages)]
    raws: list[np.ndarray] = []
    for m in messages:
        header += [m.src, m.dst, len(m.tensors)]
        for t in m.tensors:
            header += [_CODE[t.dtype], t.dim(), *t.shape]
            raws.append(_raw(t))
    head = np.asarray([len(header)] + header, dtype=np.int64).view(np.uint8)
    sizes = [(r.size + _ALIGN - 1) // _ALIGN * _ALIGN for r in raws]
    buf = np.zeros(head.size + sum(sizes), dtype=np.uint8)
    buf[: head.size] = head
    pos = head.size
    for r, size in zip(raws, sizes):
        buf[pos : pos + r.size] = r
        pos += size
    return buf


def unpack(buf: np.ndarray) -> list[tuple[int, int, tuple[torch.Tensor, ...]]]:
    n_header = int(buf[:8].view(np.int64)[0])
    header = buf[8 : 8 + 8 * n_header].view(np.int64).tolist()
    pos, h = 8 + 8 * n_header, 1
    out = []
    for _ in range(header[0]):
        src, dst, n_tensors = header[h : h + 3]
        h += 3
        tensors = []
        for _ in range(n_tensors):
            dtype, ndim = _DTYPES[header[h]], header[h + 1]
            shape = header[h + 2 : h + 2 + ndim]
            h += 2 + ndim
            count = int(np.prod(shape)) if shape else 1
            wire = torch.int16 if dtype == torch.bfloat16 else dtype
            nbytes = count * torch.empty((), dtype=wire).element_size()
            if nbytes == 0:
                tensors.append(torch.empty(shape, dtype=dtype))
                continue
            t = torch.from_numpy(buf[pos : pos + nbytes].copy()).view(wire).reshape(shape)
            tensors.append(t.view(dtype) if wire is not dtype else t)
            pos += (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
        out.append((src, dst, tuple(tensors)))
    return out


class MpiTransport(Transport):
    def __init__(self, peers: int, extra_on_root: int = 0, timeout: float = 600.0, comm=None):
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = comm or MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.collective_tag = COLLECTIVE_TAG
        super().__init__(Placement(peers, self.size, extra_on_root), timeout)

    @contextmanager
    def emergency(self):
        self.collective_tag = EMERGENCY_TAG
        try:
            yield
        finally:
            self.collective_tag = COLLECTIVE_TAG

    @contextmanager
    def _failures(self, what: str, peers_on=None):
        """Under mpirun --with-ft ulfm, an MPI call that touches a dead rank raises: that becomes a
        CommTimeout naming the failed ranks. Every surviving rank may see it at once: the lowest of them
        prints, the others hand it their message and wait for it to end the job (one line, not one a rank)."""
        try:
            yield
        except self.MPI.Exception as exc:
            try:
                group = self.comm.Get_failed()
                failed = set(
                    self.MPI.Group.Translate_ranks(group, list(range(group.Get_size())), self.comm.Get_group())
                )
            except self.MPI.Exception:
                failed = set()
            self._missing(what, failed, peers_on, f"rank failed ({exc.Get_error_string()})")

    def _remote_exchange(self, phase, round_index, remote, pending, inbox, kind) -> None:
        with self._failures(f"round {round_index + 1}, {phase}"):
            self._exchange_buffers(phase, round_index, remote, pending, inbox, kind)

    def _exchange_buffers(self, phase, round_index, remote, pending, inbox, kind) -> None:
        MPI, comm, tag = self.MPI, self.comm, _tag(phase, round_index)
        by_rank: dict[int, list[Message]] = defaultdict(list)
        for m in remote:
            by_rank[self.placement.rank_of(m.dst)].append(m)
        buffers = {r: pack(msgs) for r, msgs in by_rank.items()}
        what = f"round {round_index + 1}, {phase}"
        sends = [comm.Isend([buf, MPI.BYTE], dest=r, tag=tag) for r, buf in buffers.items()]
        senders = {self.placement.rank_of(s) for s, _ in pending}

        def receive(r: int, status) -> None:
            buf = np.empty(status.Get_count(MPI.BYTE), dtype=np.uint8)
            comm.Recv([buf, MPI.BYTE], source=r, tag=tag)
            for src, dst, tensors in unpack(buf):
                inbox[dst][src] = kind.from_tensors(tensors).to(self.device)

        deadline = self._poll(
            senders,
            tag,
            receive,
            what,
            lambda ranks: sorted({s for s, _ in pending if self.placement.rank_of(s) in ranks}),
        )
        self._complete(sends, sorted(buffers), what, deadline)

    def _poll(self, sources, tag: int, receive, what: str, peers_on=None) -> float:
        """receive(rank, status) for one message from each source rank, polling until --comm-timeout."""
        MPI, comm = self.MPI, self.comm
        waiting = set(sources)
        deadline, nap, status = time.monotonic() + self.timeout, 1e-5, MPI.Status()
        while waiting:
            got = False
            if comm.Iprobe(source=MPI.ANY_SOURCE, tag=NOTICE_TAG, status=status):  # another rank gave up
                raise CommTimeout(comm.recv(source=status.Get_source(), tag=NOTICE_TAG), self.rank)
            for r in sorted(waiting):
                if comm.Iprobe(source=r, tag=tag, status=status):
                    receive(r, status)
                    waiting.discard(r)
                    got = True
            if waiting and not got:
                if time.monotonic() > deadline:
                    self._missing(what, waiting, peers_on, f"no message after {self.timeout:g} s")
                time.sleep(nap)
                nap = min(nap * 2, 2e-3)
            else:
                nap = 1e-5
        return deadline

    def _complete(self, requests, dests, what: str, deadline: float) -> None:
        while not self.MPI.Request.testall(requests)[0]:
            if time.monotonic() > deadline:
                self._missing(what, set(dests), None, f"sends not completed after {self.timeout:g} s")
            time.sleep(1e-4)

    def _missing(self, what: str, ranks: set[int], peers_on, why: str, reporter: int | None = None):
        peers = peers_on(ranks) if peers_on else sorted(p for r in ranks for p in self.placement.nodes_of(r))
        shown = f"{peers[:20]}{' ...' if len(peers) > 20 else ''}"
        alive = [r for r in range(self.size) if r not in ranks]
        exc = CommTimeout(
            f"{what}: {why} from peers {shown} on ranks {sorted(ranks)}",
            (alive[0] if alive else 0) if reporter is None else reporter,
        )
        exc.notify = lambda: self._notify(exc)
        raise exc

    def _notify(self, exc: CommTimeout) -> None:
        """Tell the reporting rank why this rank gave up, and give it time to print and end the job
        (mpirun stops the others when it exits); returns if it did not, so the caller prints instead."""
        try:
            request = self.comm.isend(str(exc), dest=exc.reporter, tag=NOTICE_TAG)
            deadline = time.monotonic() + NOTICE_GRACE
            while time.monotonic() < deadline:
                request.test()
                time.sleep(0.05)
        except self.MPI.Exception:  # the reporter is gone too
            pass

    def announce_stop(self, why: str) -> None:
        for r in range(self.size):
            if r != self.rank:
                self.comm.isend(why, dest=r, tag=STOP_TAG)  # small: sent eagerly, never waited for

    def watch_for_stops(self, on_stop) -> None:
        if self.size == 1 or self.MPI.Query_thread() != self.MPI.THREAD_MULTIPLE:
            return
        self._watching = threading.Event()

        def watch(watching=self._watching):
            status = self.MPI.Status()
            while not watching.wait(STOP_POLL):
                if self.comm.Iprobe(source=self.MPI.ANY_SOURCE, tag=STOP_TAG, status=status):
                    on_stop(self.comm.recv(source=status.Get_source(), tag=STOP_TAG))
                    return

        threading.Thread(target=watch, name="p2pfl-stop-messages", daemon=True).start()

    def stop_watching(self) -> None:
        if getattr(self, "_watching", None) is not None:
            self._watching.set()

    # Bookkeeping collectives, as polled point-to-point messages (see the module's docstring).
    def _gather_objects(self, obj, what: str) -> list | None:
        if self.rank != 0:
            self._complete(
                [self.comm.isend(obj, dest=0, tag=self.collective_tag)], [0], what, time.monotonic() + self.timeout
            )
            return None
        got = {0: obj}
        self._poll(
            range(1, self.size),
            self.collective_tag,
            lambda r, status: got.__setitem__(r, self.comm.recv(source=r, tag=self.collective_tag)),
            what,
        )
        return [got[r] for r in range(self.size)]

    def _bcast_object(self, obj, what: str):
        if self.rank == 0:
            sends = [self.comm.isend(obj, dest=r, tag=self.collective_tag) for r in range(1, self.size)]
            self._complete(sends, list(range(1, self.size)), what, time.monotonic() + self.timeout)
            return obj
        got = []
        self._poll(
            [0],
            self.collective_tag,
            lambda r, status: got.append(self.comm.recv(source=0, tag=self.collective_tag)),
            what,
        )
        return got[0]

    def _what(self, name: str) -> str:
        return f"round {self.round_index + 1}, {name}"

    def gather_rows(self, rows: torch.Tensor) -> torch.Tensor | None:
        parts = self.gather(rows.detach().cpu().numpy())
        return torch.from_numpy(np.concatenate(parts)).to(rows.device) if parts is not None else None

    def gather(self, obj):
        what = self._what("gather to rank 0")
        with self._failures(what):
            return self._gather_objects(obj, what)

    def bcast(self, obj):
        what = self._what("broadcast from rank 0")
        with self._failures(what):
            return self._bcast_object(obj, what)

    def reduce(self, values: torch.Tensor) -> torch.Tensor | None:
        what = self._what("sum to rank 0")
        with self._failures(what):
            total = self._tree_sum(values.detach().cpu().double().numpy(), what)
        return torch.from_numpy(total).to(values.device) if total is not None else None

    def allreduce(self, values: torch.Tensor) -> torch.Tensor:
        what = self._what("sum over ranks")
        with self._failures(what):
            total = self._tree_cast(self._tree_sum(values.detach().cpu().double().numpy(), what), what)
        return torch.from_numpy(total).to(values.device)

    def _tree_sum(self, total: np.ndarray, what: str) -> np.ndarray | None:
        """Sums up a binary tree of the ranks (rank r's children are 2r+1 and 2r+2): each rank holds and
        sends one array, whatever the number of ranks; the order of the sums is fixed by the rank count."""
        total = total.copy()
        parts: dict[int, np.ndarray] = {}
        children = self._tree_children()
        self._poll(
            children,
            self.collective_tag,
            lambda r, status: parts.__setitem__(r, self.comm.recv(source=r, tag=self.collective_tag)),
            what,
        )
        for c in children:
            total += parts[c]
        if self.rank == 0:
            return total
        parent = (self.rank - 1) // 2
        self._complete(
            [self.comm.isend(total, dest=parent, tag=self.collective_tag)],
            [parent],
            what,
            time.monotonic() + self.timeout,
        )
        return None

    def _tree_children(self) -> list[int]:
        """This rank's children in the binary tree of the ranks the sums travel: 2r+1 and 2r+2."""
        return [c for c in (2 * self.rank + 1, 2 * self.rank + 2) if c < self.size]

    def _tree_cast(self, total: np.ndarray | None, what: str) -> np.ndarray:
        """Rank 0's array down the same tree to every rank."""
        if self.rank != 0:
            got = []
            self._poll(
                [(self.rank - 1) // 2],
                self.collective_tag,
                lambda r, status: got.append(self.comm.recv(source=r, tag=self.collective_tag)),
                what,
            )
            total = got[0]
        children = self._tree_children()
        sends = [self.comm.isend(total, dest=c, tag=self.collective_tag) for c in children]
        self._complete(sends, children, what, time.monotonic() + self.timeout)
        return total

    def agree(self, flag, rank0_value):
        flags = self.gather(bool(flag))
        return self.bcast((any(flags), rank0_value) if flags is not None else None)

    def barrier(self) -> None:
        self.gather(None)
        self.bcast(None)
