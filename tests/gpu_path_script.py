"""p2pfl.run's command line with a GPU's NTK-DFL path taken on the CPU (p2pfl.testing.gpu_path_on_the_cpu):
tests/test_hood_batch.py runs it in one process and under mpirun, so that the padded batch of neighbourhoods
is checked across ranks, as a GPU cluster runs it."""

import sys

from p2pfl.run import main
from p2pfl.testing import gpu_path_on_the_cpu

with gpu_path_on_the_cpu():
    code = main(sys.argv[1:])
sys.exit(code)
