"""p2pfl: a decentralized peer-to-peer learning simulator on a graph."""
import os

# numpy's BLAS on one thread: NTK evolutions run one per thread on all cores (p2pfl.ntk.step), and a
# single-threaded BLAS sums in the same order whatever else runs, so results do not depend on it.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

__version__ = "0.1.0"
