"""One NTK evolution step on a stack of Jacobians: kernel, evolution, candidate weights, selection.

NTK-DFL runs it at every peer over its neighbourhood; NTK-FL at the server over the sampled clients.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from p2pfl.ntk.evolution import evolve, linearized_loss


@dataclass(frozen=True)
class NTKSettings:
    loss: str = "ce"  # ce (ODE) or mse (closed form)
    taus: tuple[int, ...] = (100, 200, 300, 400, 500, 600, 700, 800)
    ode: str = "deflated"
    selection: str = "network"  # network | linearized | own


@dataclass
class StepResult:
    weights: torch.Tensor  # (D,) the chosen candidate
    tau: int
    losses: torch.Tensor  # (T,) the selection loss of every candidate


def ntk_step(jac, shape, w: torch.Tensor, f0: torch.Tensor, labels: torch.Tensor, n_classes: int, eta: float,
             settings: NTKSettings, network_loss: Callable[[torch.Tensor], torch.Tensor] | None = None) -> StepResult:
    """Evolve from weights w (D,) with the stacked Jacobian jac taken at w, outputs f0 (N, C) and labels (N,).

    network_loss maps candidate weights (T, D) to their true-network losses (T,); it is used for the
    'network' and 'own' selections (the caller decides on which samples)."""
    Y = F.one_hot(labels, n_classes).to(f0.dtype)
    H = jac.kernel(shape, w)
    evo = evolve(settings.loss, H, f0, Y, eta, list(settings.taus), settings.ode)
    candidates = w[None] - (eta / H.shape[0]) * jac.transpose_apply(shape, w, evo.residual_sums)
    if settings.selection == "linearized":
        losses = linearized_loss(settings.loss, evo, Y)
    else:
        losses = network_loss(candidates)
    best = int(torch.argmin(losses))  # first of equals, as the reference code
    return StepResult(candidates[best], settings.taus[best], losses)
