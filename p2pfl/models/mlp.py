"""The papers' MLP: flatten -> Linear -> ReLU -> ... -> Linear (Kaiming-normal weights, zero biases)."""

from __future__ import annotations

from dataclasses import dataclass
import torch
from torch import nn

from p2pfl.models.layout import ParamLayout


class MLP(nn.Module):
    def __init__(self, n_inputs: int, hidden: list[int], n_classes: int):
        super().__init__()
        widths = [n_inputs, *hidden, n_classes]
        layers: list[nn.Module] = [nn.Flatten()]
        for i, (a, b) in enumerate(zip(widths, widths[1:])):
            layers.append(nn.Linear(a, b))
            if i < len(widths) - 2:
                layers.append(nn.ReLU())
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@dataclass(frozen=True)
class MLPShape:
    """Which slots of the flat vector are each Linear layer's weight and bias, and the activation."""

    weights: list[slice]
    biases: list[slice]
    dims: list[tuple[int, int]]  # (out, in) per layer
    activation: str  # 'relu'

    @staticmethod
    def of(model: nn.Module, layout: ParamLayout) -> "MLPShape":
        if not isinstance(model, MLP):
            raise TypeError("the factored Jacobian needs the MLP (Linear layers + ReLU); use the dense path")
        slots = {s.name: s for s in layout.slots}
        weights, biases, dims = [], [], []
        for name, module in model.named_modules():
            if isinstance(module, nn.Linear):
                w, b = slots[f"{name}.weight"], slots[f"{name}.bias"]
                weights.append(slice(w.offset, w.offset + w.numel))
                biases.append(slice(b.offset, b.offset + b.numel))
                dims.append((module.out_features, module.in_features))
        return MLPShape(weights, biases, dims, "relu")

    @property
    def n_classes(self) -> int:
        return self.dims[-1][0]

    def weight(self, flat: torch.Tensor, layer: int) -> torch.Tensor:
        return flat[self.weights[layer]].view(self.dims[layer])

    def dense_size(self) -> int:
        return sum(o * i + o for o, i in self.dims)
