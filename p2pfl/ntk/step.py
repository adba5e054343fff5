"""One NTK evolution step on a stack of Jacobians: kernel, evolution, candidate weights, selection.

NTK-DFL runs it at every peer over its neighbourhood; NTK-FL at the server over the sampled clients.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from p2pfl import stopping
from p2pfl.ntk.batched_evolution import evolve_ce_batched
from p2pfl.ntk.evolution import evolve, linearized_loss


@dataclass(frozen=True)
class NTKSettings:
    loss: str = "ce"  # ce (ODE) or mse (closed form)
    taus: tuple[int, ...] = (100, 200, 300, 400, 500, 600, 700, 800)
    ode: str = "split"
    selection: str = "network"  # network | linearized | own


@dataclass
class StepResult:
    weights: torch.Tensor  # (D,) the chosen candidate
    tau: int
    losses: torch.Tensor  # (T,) the selection loss of every candidate


@dataclass
class StepBatch:
    """A chunk of steps: each peer's chosen weights (B, D), its t, and every candidate's selection loss
    (B, T)."""

    weights: torch.Tensor
    taus: list[int]
    losses: torch.Tensor

    @staticmethod
    def of(results: list[StepResult]) -> "StepBatch":
        return StepBatch(
            torch.stack([r.weights for r in results]),
            [r.tau for r in results],
            torch.stack([r.losses for r in results]),
        )


@dataclass
class NTKProblem:
    """One evolution: a stacked Jacobian taken at weights w (D,), outputs f0 (N, C) and labels (N,).
    network_loss maps candidate weights (T, D) to their true-network losses (T,); it is used for the
    'network' and 'own' selections (the caller decides on which samples)."""

    jac: object
    w: torch.Tensor
    f0: torch.Tensor
    labels: torch.Tensor
    network_loss: Callable[[torch.Tensor], torch.Tensor] | None = None


def ntk_steps(problems: list[NTKProblem], shape, n_classes: int, eta: float, settings: NTKSettings) -> list[StepResult]:
    """Kernel, evolution, candidate weights and selection of several problems. On a GPU the evolutions
    are one batch (p2pfl.ntk.batched_evolution). On the CPU they are compiled loops that release the
    GIL, run on as many threads as torch has (the rank's share of the cores), one problem each; the
    kernels and candidates are torch's, which uses those threads itself (measured: faster than each
    problem whole on one thread with one torch thread). Each problem's arithmetic is
    the same whatever the threads, so the results are too."""
    workers = torch.get_num_threads()
    kernels = [p.jac.kernel(shape, p.w) for p in problems]
    targets = [F.one_hot(p.labels, n_classes).to(p.f0.dtype) for p in problems]

    def evolution(i):
        stopping.check()  # a stop at once: the queued evolutions end here, not after running
        return evolve(settings.loss, kernels[i], problems[i].f0, targets[i], eta, list(settings.taus), settings.ode)

    if problems and evolves_batched(kernels[0].device, settings):
        evolutions = evolve_ce_batched(
            kernels, [p.f0 for p in problems], targets, eta, list(settings.taus), euler=settings.ode != "split"
        )
    elif workers > 1 and len(problems) > 1:
        with ThreadPoolExecutor(workers) as pool:
            evolutions = list(pool.map(evolution, range(len(problems))))
    else:
        evolutions = [evolution(i) for i in range(len(problems))]
    picked = []
    for p, Y, evo in zip(problems, targets, evolutions):
        # every candidate's weights, also for the linearized selection, which needs only the chosen one's:
        # one product for all keeps its rounding the same whatever the threads (one candidate's did not)
        candidates = p.w[None] - evo.scale * p.jac.transpose_apply(shape, p.w, evo.residual_sums)
        losses, best = select_t(
            settings.selection, lambda: linearized_loss(settings.loss, evo, Y), lambda: p.network_loss(candidates)
        )
        picked.append((candidates.index_select(0, best[None])[0], best, losses))
    chosen = torch.stack([best for _, best, _ in picked]).tolist() if picked else []  # one wait, not one a problem
    return [StepResult(w, settings.taus[b], losses) for (w, _, losses), b in zip(picked, chosen)]


def select_t(selection: str, linearized: Callable[[], torch.Tensor], network: Callable[[], torch.Tensor]):
    """The rule that picks t among the candidates, for one problem or a batch (losses (..., T)): the least
    loss, the first of equals as the reference code, found on the device. Losses of the evolved outputs
    ('linearized') or of the candidate networks ('network', 'own': the caller chose the samples)."""
    losses = linearized() if selection == "linearized" else network()
    return losses, torch.argmin(losses, -1)


def evolves_batched(device: torch.device, settings: NTKSettings) -> bool:
    """Whether the evolutions run as one batch of products on the device (a GPU: the CE ODE and its Euler
    steps) rather than one compiled loop per CPU thread (the CPU; the MSE closed form; 'adaptive')."""
    return device.type != "cpu" and settings.loss == "ce" and settings.ode in ("split", "euler", "deflated")


def ntk_step(
    jac,
    shape,
    w: torch.Tensor,
    f0: torch.Tensor,
    labels: torch.Tensor,
    n_classes: int,
    eta: float,
    settings: NTKSettings,
    network_loss: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> StepResult:
    """One problem of ntk_steps: evolve from weights w with the stacked Jacobian jac taken at w."""
    return ntk_steps([NTKProblem(jac, w, f0, labels, network_loss)], shape, n_classes, eta, settings)[0]
