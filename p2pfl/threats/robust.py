"""How an honest peer averages what it heard from its neighbours when some may be Byzantine, one function
a rule, each from its paper and compared with the code of He, Karimireddy and Jaggi
(epfml/byzantine-robust-decentralized-optimizer, codes/aggregator.py: SelfCenteredClipping, DeTM, DeCM,
DeKrum). A rule takes the peer's Neighbourhood and returns its new weights."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Neighbourhood:
    """An honest peer's view of one averaging: its weights, what its in-neighbours sent (attackers'
    messages included, unknown to it as such), the mixing weights, and the rules' settings."""

    own: torch.Tensor  # x_i
    own_weight: float  # W_ii
    heard: list[tuple[float, torch.Tensor]]  # (W_ij, x_j) for each in-neighbour j that was heard, in peer order
    bound: int  # b: the Byzantine neighbours a rule is to withstand (--robust-bound)
    radius: float | None  # --clip-radius; None: ClippedGossip's own rule


Rule = Callable[[Neighbourhood], torch.Tensor]


def clipped_gossip(hood: Neighbourhood) -> torch.Tensor:
    """Self-centered clipping (ClippedGossip, He, Karimireddy and Jaggi 2022): x_i + sum_j W_ij clip(x_j -
    x_i, tau), clip(v, tau) = v min(1, tau / |v|). tau: --clip-radius, or the authors' adaptive rule, the
    (b+1)-th largest distance to a neighbour, so that the b farthest are clipped (their code's
    sorted(distances)[-2] is b = 1)."""
    own = hood.own.double()
    if not hood.heard:
        return hood.own.clone()
    moves = [(w, x.double() - own) for w, x in hood.heard]
    norms = [float(v.norm()) for _, v in moves]
    if hood.radius is not None:
        tau = hood.radius
    else:
        ranked = sorted(norms, reverse=True)
        tau = ranked[hood.bound] if hood.bound < len(ranked) else 0.0
    out = own.clone()
    for (w, v), norm in zip(moves, norms):
        if norm > 0:
            out += w * min(1.0, tau / norm) * v
    return out.to(hood.own.dtype)


def _stacked(hood: Neighbourhood) -> torch.Tensor:
    return torch.stack([hood.own, *(x for _, x in hood.heard)]).double()


def trimmed_mean(hood: Neighbourhood) -> torch.Tensor:
    """Coordinate-wise trimmed mean of the peer and its neighbours (BRIDGE-T, Yang and Bajwa 2019): the b
    largest and b smallest values of each coordinate dropped, the rest averaged unweighted. Where 2b would
    drop every value, b is lowered until one stays, as the authors' DeTM does."""
    values = _stacked(hood)
    b = hood.bound
    while b > 0 and len(values) - 2 * b <= 0:
        b -= 1
    kept = values.sort(0).values[b : len(values) - b]
    return kept.mean(0).to(hood.own.dtype)


def median(hood: Neighbourhood) -> torch.Tensor:
    """Coordinate-wise median of the peer and its neighbours (BRIDGE-M): the middle value, or the mean of
    the two middle values of an even count (the authors' DeCM)."""
    values = _stacked(hood)
    upper = values.median(0).values
    lower = -((-values).median(0).values)
    return ((upper + lower) / 2).to(hood.own.dtype)


def krum(hood: Neighbourhood) -> torch.Tensor:
    """Krum over the peer and its neighbours (Blanchard et al., NeurIPS 2017): each candidate's score is
    the sum of its n - b - 2 smallest squared distances to the others; the candidate of least score is
    taken (ties to the earlier, the peer itself first). Krum needs n > 2b + 2; with fewer candidates each
    score sums at least one distance."""
    values = _stacked(hood)
    distances = torch.cdist(values, values).square()
    keep = max(1, len(values) - hood.bound - 2)
    scores = [float(row[torch.arange(len(values)) != i].sort().values[:keep].sum()) for i, row in enumerate(distances)]
    best = min(range(len(scores)), key=lambda i: (scores[i], i))
    return hood.own.clone() if best == 0 else hood.heard[best - 1][1].clone()


RULES: dict[str, Rule] = {
    "clipped-gossip": clipped_gossip,
    "trimmed-mean": trimmed_mean,
    "median": median,
    "krum": krum,
}
