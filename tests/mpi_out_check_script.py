"""Under mpirun: each rank checks its own --out (rank 0's empty, the others' holding a file), standing in
for ranks that look at one shared folder at different times. Every rank must take rank 0's answer."""

import sys
from pathlib import Path
from types import SimpleNamespace

from p2pfl.comm import mpi_world
from p2pfl.runner.fit_checks import check_out

rank = mpi_world()[0]
check_out(SimpleNamespace(out=str(Path(sys.argv[1]) / f"r{rank}"), overwrite=False, resume=False))
print(f"rank {rank} ok", flush=True)
