"""Transports: in-process and MPI, behind one interface; make_transport picks by how we were launched. Beside
them, what the network does to messages and time: simulated faults (faults.py), the virtual clock's network
and system model (clock.py) and peers that leave and come back (availability.py)."""

from __future__ import annotations

import os

import torch

from p2pfl.threads import ranks_on_this_machine
from p2pfl.comm.transport import (
    CommTimeout,
    Inbox,
    LocalTransport,
    Message,
    Payload,
    Placement,
    Tensors,
    Transport,
    Weights,
)

_LAUNCHER_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")


def launched_by_mpi() -> bool:
    """True under mpirun/srun; checked before importing mpi4py, which would start MPI by itself."""
    return any(v in os.environ for v in _LAUNCHER_VARS)


_local_size: int | None = None  # the ranks on this machine, as MPI's shared-memory communicator counts them


def mpi_world() -> tuple[int, int, int]:
    """(rank, size, local rank) without building a transport; (0, 1, 0) outside MPI. Collective: every
    rank calls it (it also counts the ranks of this machine, for ranks_sharing_this_machine)."""
    global _local_size
    if not launched_by_mpi():
        return 0, 1, 0
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    shared = comm.Split_type(MPI.COMM_TYPE_SHARED)
    local, _local_size = shared.Get_rank(), shared.Get_size()
    shared.Free()
    return comm.Get_rank(), comm.Get_size(), local


def rank0_decides(value):
    """Rank 0's value on every rank (a broadcast on COMM_WORLD under MPI, which every rank must reach):
    for a decision read from a shared file system, which a rank ahead of the others may already have
    changed (a rank that saw rank 0's new run folder would refuse it alone and hang the others)."""
    if not launched_by_mpi():
        return value
    from mpi4py import MPI

    return MPI.COMM_WORLD.bcast(value, root=0)


def ranks_sharing_this_machine() -> int:
    """How many ranks run on this machine (and share its GPUs): MPI's own count where mpi_world ran, whatever
    the launcher (srun sets no Open MPI or MPICH variable), else the launcher's variables, else 1."""
    return _local_size or ranks_on_this_machine() or 1


def make_transport(peers: int, extra_on_root: int = 0, timeout: float = 600.0, device=None) -> Transport:
    """The transport for how we were launched; what it receives is handed over on device."""
    if launched_by_mpi():
        from p2pfl.comm.mpi import MpiTransport

        transport = MpiTransport(peers, extra_on_root, timeout)
    else:
        transport = LocalTransport(peers, extra_on_root, timeout)
    if device is not None:
        transport.device = torch.device(device)
    return transport


__all__ = [
    "CommTimeout",
    "Inbox",
    "LocalTransport",
    "Message",
    "Payload",
    "Placement",
    "Tensors",
    "Transport",
    "Weights",
    "make_transport",
    "launched_by_mpi",
    "mpi_world",
    "rank0_decides",
    "ranks_sharing_this_machine",
]
