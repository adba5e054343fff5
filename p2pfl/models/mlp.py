"""The papers' MLP: flatten -> Linear -> ReLU -> ... -> Linear (Kaiming-normal weights, zero biases)."""
from __future__ import annotations

import torch
from torch import nn


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
