"""Transports: in-process and MPI, behind one interface; make_transport picks by how we were launched."""

from __future__ import annotations

import os

import torch

from p2pfl.comm.local import LocalTransport
from p2pfl.comm.transport import CommTimeout, Inbox, Message, Payload, Placement, Tensors, Transport, Weights

_LAUNCHER_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")


def launched_by_mpi() -> bool:
    """True under mpirun/srun; checked before importing mpi4py, which would start MPI by itself."""
    return any(v in os.environ for v in _LAUNCHER_VARS)


def mpi_world() -> tuple[int, int, int]:
    """(rank, size, local rank) without building a transport; (0, 1, 0) outside MPI."""
    if not launched_by_mpi():
        return 0, 1, 0
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    local = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
    return comm.Get_rank(), comm.Get_size(), local


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
]
