"""Layers whose randomness and statistics stay per peer when a rank's peers run as one vmap batch."""

from __future__ import annotations

import torch
from torch import nn


class PeerDropout(nn.Module):
    """Dropout whose keep-mask is given from outside as the buffer `noise` (uniform draws, one per
    feature of every sample), so each peer's mask comes from its own seeded generator and a run's
    numbers do not depend on how peers share a vmap batch or a rank. Without noise it is the identity
    (evaluation, and NTK Jacobians)."""

    def __init__(self, p: float, features: int):
        super().__init__()
        self.p, self.features = p, features
        self.register_buffer("noise", torch.zeros(0), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.noise.numel() == 0:
            return x
        keep = (self.noise.view(x.shape) >= self.p).to(x.dtype)
        return x * keep / (1.0 - self.p)


def norm_layer(kind: str, channels: int) -> nn.Module:
    """batch: BatchNorm2d (running statistics travel with the weights); group: GroupNorm with 2 groups
    (TCT appendix B.2), which normalises each sample alone."""
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    if kind == "group":
        return nn.GroupNorm(2, channels)
    raise ValueError(f"unknown norm {kind!r}")
