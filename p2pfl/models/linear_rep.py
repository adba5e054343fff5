"""The two-layer linear representation of FedAvg with fine-tuning (Collins et al. 2022, section 5.1):
y = <B w, x> with a shared representation B (d, k) and a head w (k,)."""

from __future__ import annotations

import math

import torch
from torch import nn


class LinearRepresentation(nn.Module):
    def __init__(self, d: int, k: int):
        super().__init__()
        self.B = nn.Parameter(torch.zeros(d, k))
        self.w = nn.Parameter(torch.zeros(k))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.reshape(len(x), -1) @ self.B) @ self.w

    def reset(self, gen: torch.Generator) -> None:
        """B0 with orthonormal columns (QR of a Gaussian matrix), w0 Gaussian with variance 1/k."""
        with torch.no_grad():
            q, _ = torch.linalg.qr(torch.randn(self.B.shape, generator=gen))
            self.B.copy_(q)
            self.w.copy_(torch.randn(self.w.shape, generator=gen) / math.sqrt(len(self.w)))
