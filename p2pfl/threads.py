"""Thread pools per rank, decided before torch starts them (numpy's BLAS is on one thread:
p2pfl/__init__.py). Under mpirun, ranks on one machine share its cores."""

from __future__ import annotations

import os


def ranks_on_this_machine() -> int | None:
    """How many ranks mpirun started on this machine (None without mpirun)."""
    local = os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE") or os.environ.get("MPI_LOCALNRANKS")
    return int(local) if local else None


def threads_per_rank() -> None:
    """OpenMP (torch) gets each rank's share of the cores instead of all of them, which would make the
    pools spin against each other; only where the environment does not say already, and only in effect
    before torch is imported (the CLI calls it first)."""
    local = ranks_on_this_machine()
    if local:
        share = str(max(1, (os.cpu_count() or 1) // local))
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(var, share)
