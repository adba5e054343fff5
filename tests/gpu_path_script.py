"""p2pfl.run's command line with a GPU's NTK-DFL path taken on the CPU: the evolutions as one batch, a chunk of
neighbourhoods as one padded batch, no 8-bit pixel codes, stacked mixing. tests/test_hood_batch.py runs it in
one process and under mpirun, so that the padded batch is checked across ranks, as a GPU cluster runs it."""

import sys
from functools import partial

from p2pfl.algorithms import base
from p2pfl.ntk import plan, step
from p2pfl.ntk.pixels import PixelInputs


def batched(device, settings) -> bool:
    return settings.loss == "ce" and settings.ode in ("split", "euler", "deflated")


step.evolves_batched = plan.evolves_batched = batched
PixelInputs.encode = staticmethod(lambda x, levels: None)
base.mix_rows = partial(base.mix_rows, stacked=True)

from p2pfl.run import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
