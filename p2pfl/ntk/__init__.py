"""The NTK math shared by NTK-DFL, NTK-FL, CP-NTK-FL and TCT: Jacobians (factored and dense), the
kernel, evolution of outputs and weights, and Jacobian compression."""

from p2pfl.ntk.evolution import Evolution, evolve, linearized_loss
from p2pfl.ntk.jacobian import DenseJacobian, FactoredJacobian

__all__ = ["DenseJacobian", "Evolution", "FactoredJacobian", "evolve", "linearized_loss"]
