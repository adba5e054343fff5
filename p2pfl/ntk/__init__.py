"""The NTK math shared by NTK-DFL, NTK-FL, CP-NTK-FL and TCT: Jacobians (factored and dense), the
kernel, evolution of outputs and weights, and Jacobian compression.

- jacobian.py: per-sample Jacobians, factored (MLPs) or dense (any model), and their kernels;
- codec.py, compression.py: a Jacobian into message tensors and back; top-k and b-bit compression;
- pixels.py, inputs_cache.py: exact integer products with 8-bit pixels, and what a peer's inputs reuse;
- neighbourhood.py: a peer's evolution problem over its neighbourhood;
- step.py: one NTK step (kernel, evolution, candidates) and select_t, the rule that picks t;
- evolution.py: the evolution for every candidate t (the CPU's split, Euler and adaptive solvers);
- numerics.py: the evolution's numerical steps, written once for both devices;
- split_loop.py, precompile.py: the CPU's compiled loop (numba) and its ahead-of-time compile;
- batched_evolution.py, hood_batch.py: a GPU's evolution of many neighbourhoods as one padded batch;
- plan.py: how much of a round's NTK work a rank holds at once;
- convexified.py: TCT's convexified network (empirical-NTK features).
"""

from p2pfl.ntk.evolution import Evolution, evolve, linearized_loss
from p2pfl.ntk.jacobian import DenseJacobian, FactoredJacobian

__all__ = ["DenseJacobian", "Evolution", "FactoredJacobian", "evolve", "linearized_loss"]
