"""MPI transport (mpi4py): one contiguous byte buffer per (sending rank, receiving rank) and phase.

Each buffer holds a small int64 header (who sent what to whom, dtypes, shapes) and the raw tensor
bytes: no pickling on the hot path. Messages carry a tag made from (round, phase); receives poll
with Iprobe so a missing peer ends in a CommTimeout that names it instead of a silent hang.
"""
from __future__ import annotations

import time
import zlib
from collections import defaultdict

import numpy as np
import torch

from p2pfl.comm.transport import CommTimeout, Message, Placement, Transport

_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
           torch.int16, torch.int8, torch.uint8, torch.bool]
_CODE = {dt: i for i, dt in enumerate(_DTYPES)}
_ALIGN = 8


def _tag(phase: str, round_index: int) -> int:
    return (round_index % 1000) * 32 + zlib.crc32(phase.encode()) % 32  # < 32767, MPI's guaranteed bound


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
    buf[:head.size] = head
    pos = head.size
    for r, size in zip(raws, sizes):
        buf[pos:pos + r.size] = r
        pos += size
    return buf


def unpack(buf: np.ndarray) -> list[tuple[int, int, tuple[torch.Tensor, ...]]]:
    n_header = int(buf[:8].view(np.int64)[0])
    header = buf[8:8 + 8 * n_header].view(np.int64).tolist()
    pos, h = 8 + 8 * n_header, 1
    out = []
    for _ in range(header[0]):
        src, dst, n_tensors = header[h:h + 3]
        h += 3
        tensors = []
        for _ in range(n_tensors):
            dtype, ndim = _DTYPES[header[h]], header[h + 1]
            shape = header[h + 2:h + 2 + ndim]
            h += 2 + ndim
            count = int(np.prod(shape)) if shape else 1
            wire = torch.int16 if dtype == torch.bfloat16 else dtype
            nbytes = count * torch.empty((), dtype=wire).element_size()
            if nbytes == 0:
                tensors.append(torch.empty(shape, dtype=dtype))
                continue
            t = torch.from_numpy(buf[pos:pos + nbytes].copy()).view(wire).reshape(shape)
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
        super().__init__(Placement(peers, self.size, extra_on_root), timeout)

    def _remote_exchange(self, phase, round_index, remote, pending, inbox, kind) -> None:
        MPI, comm, tag = self.MPI, self.comm, _tag(phase, round_index)
        by_rank: dict[int, list[Message]] = defaultdict(list)
        for m in remote:
            by_rank[self.placement.rank_of(m.dst)].append(m)
        buffers = {r: pack(msgs) for r, msgs in by_rank.items()}
        sends = [comm.Isend([buf, MPI.BYTE], dest=r, tag=tag) for r, buf in buffers.items()]
        waiting = {self.placement.rank_of(s) for s, _ in pending}
        deadline, nap, status = time.monotonic() + self.timeout, 1e-5, MPI.Status()
        while waiting:
            got = False
            for r in sorted(waiting):
                if comm.Iprobe(source=r, tag=tag, status=status):
                    buf = np.empty(status.Get_count(MPI.BYTE), dtype=np.uint8)
                    comm.Recv([buf, MPI.BYTE], source=r, tag=tag)
                    for src, dst, tensors in unpack(buf):
                        inbox[dst][src] = kind.from_tensors(tensors)
                    waiting.discard(r)
                    got = True
            if waiting and not got:
                if time.monotonic() > deadline:
                    missing = sorted(s for s, d in pending if self.placement.rank_of(s) in waiting)
                    raise CommTimeout(f"rank {self.rank}, {phase} of round {round_index}: no message after "
                                      f"{self.timeout:.0f} s from peers {missing[:20]} on ranks {sorted(waiting)}")
                time.sleep(nap)
                nap = min(nap * 2, 2e-3)
            else:
                nap = 1e-5
        while not MPI.Request.Testall(sends):
            if time.monotonic() > deadline:
                raise CommTimeout(f"rank {self.rank}, {phase} of round {round_index}: sends to ranks "
                                  f"{sorted(buffers)} not completed after {self.timeout:.0f} s")
            time.sleep(1e-4)

    def gather_rows(self, rows: torch.Tensor) -> torch.Tensor | None:
        MPI = self.MPI
        send = np.ascontiguousarray(rows.detach().cpu().numpy())
        width = send.shape[1] if send.ndim > 1 else 1
        counts = [c * width for c in self.placement.counts()]
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()
        recv = np.empty((self.placement.peers,) + send.shape[1:], dtype=send.dtype) if self.rank == 0 else None
        mpi_type = MPI._typedict[send.dtype.char]
        self.comm.Gatherv(send, [recv, counts, displs, mpi_type] if self.rank == 0 else None, root=0)
        return torch.from_numpy(recv) if self.rank == 0 else None

    def gather(self, obj):
        return self.comm.gather(obj, root=0)

    def bcast(self, obj):
        return self.comm.bcast(obj, root=0)

    def allreduce_sum(self, value):
        return self.comm.allreduce(value)

    def barrier(self) -> None:
        self.comm.Barrier()

    def abort(self, code: int) -> None:
        self.comm.Abort(code)
