"""p2pfl: a decentralized peer-to-peer learning simulator on a graph."""
import os
import sys

# numpy's BLAS on one thread, set before numpy starts it: its results depend on its thread count, and a
# run must give the same numbers alone or under mpirun; NTK evolutions run one per thread instead
# (p2pfl.ntk.step).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
if "numpy" in sys.modules:  # numpy (or torch, which imports it) came first: its BLAS has its threads already
    from threadpoolctl import threadpool_limits

    threadpool_limits(1, user_api="blas")

__version__ = "0.1.0"
