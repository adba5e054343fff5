"""Models and the stacked (peers x parameters) representation they are trained in."""
from p2pfl.models.mlp import MLP
from p2pfl.models.stack import ParamLayout, PeerStack, initial_parameters


def build_model(n_inputs: int, hidden: list[int], n_classes: int) -> MLP:
    return MLP(n_inputs, hidden, n_classes)


__all__ = ["MLP", "ParamLayout", "PeerStack", "build_model", "initial_parameters"]
