"""Thread pools per rank, decided before torch starts them (numpy's BLAS is on one thread:
p2pfl/__init__.py). Under mpirun, ranks on one machine share its cores."""

from __future__ import annotations

import os


def ranks_on_this_machine() -> int | None:
    """How many ranks mpirun started on this machine (None without mpirun)."""
    local = os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE") or os.environ.get("MPI_LOCALNRANKS")
    return int(local) if local else None


POOLS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # torch's thread pools, sized when a process starts them


def share_cores(env: dict, processes: int) -> None:
    """Each pool of a process gets its share of the cores among `processes` processes on this machine, where
    env sets none: pools of all the cores would spin against each other."""
    share = str(max(1, (os.cpu_count() or 1) // processes))
    for var in POOLS:
        env.setdefault(var, share)


def threads_per_rank() -> None:
    """OpenMP (torch) gets each rank's share of the cores instead of all of them; only where the
    environment does not say already, and only in effect before torch is imported (the CLI calls it
    first)."""
    local = ranks_on_this_machine()
    if local:
        share_cores(os.environ, local)
