"""How an honest peer, or a star's server, averages what it heard when some senders may be Byzantine, one
function a rule, each from its paper and compared with the code of He, Karimireddy and Jaggi
(epfml/byzantine-robust-decentralized-optimizer, codes/aggregator.py: SelfCenteredClipping, DeTM, DeCM,
DeKrum, Clipping). A rule takes a Neighbourhood and returns the new weights. On a graph the neighbourhood
is a peer and its in-neighbours, the peer a candidate among them; on the star it is the server's model,
which weighs nothing (own_weight 0), and the sampled clients' uploads."""

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


def _candidates(hood: Neighbourhood) -> list[torch.Tensor]:
    """The values a rule chooses among: the peer's own where it weighs (a graph), and what it heard."""
    return ([hood.own] if hood.own_weight > 0 else []) + [x for _, x in hood.heard]


def clipping(hood: Neighbourhood) -> torch.Tensor:
    """Clipping around a center c: c + sum_j W_j clip(x_j - c, tau), clip(v, tau) = v min(1, tau / |v|).
    On a graph, c is the peer's own weights: self-centered clipping (ClippedGossip, He, Karimireddy and
    Jaggi 2022); on the star, c is the server's model and the weights the clients' shares: centered clipping
    (Karimireddy, He and Jaggi, ICML 2021) with one iteration, around the last model (their momentum is the
    clients' local SGD here). tau: --clip-radius, or the authors' adaptive rule, the (b+1)-th largest
    distance to the center, so that the b farthest are clipped (their code's sorted(distances)[-2] is b = 1)."""
    own = hood.own.double()
    if not hood.heard:
        return hood.own.clone()
    moves = [(w, x.double() - own) for w, x in hood.heard]  # from the center
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
    return torch.stack(_candidates(hood)).double()


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
    """Krum (Blanchard et al., NeurIPS 2017) over the candidates: each one's score is the sum of its
    n - b - 2 smallest squared distances to the others; the candidate of least score is taken (ties to the
    earlier; on a graph the peer itself is the first). Krum needs n > 2b + 2; with fewer candidates each
    score sums at least one distance."""
    candidates = _candidates(hood)
    values = torch.stack(candidates).double()
    distances = torch.cdist(values, values).square()
    keep = max(1, len(values) - hood.bound - 2)
    scores = [float(row[torch.arange(len(values)) != i].sort().values[:keep].sum()) for i, row in enumerate(distances)]
    best = min(range(len(scores)), key=lambda i: (scores[i], i))
    return candidates[best].clone()


@dataclass(frozen=True)
class RobustRule:
    """A registered rule and where it applies: "graph" (a peer's neighbourhood), "star" (the server's
    clients), or both."""

    function: Rule
    applies: tuple[str, ...]


RULES: dict[str, RobustRule] = {
    "clipped-gossip": RobustRule(clipping, ("graph",)),
    "centered-clipping": RobustRule(clipping, ("star",)),
    "trimmed-mean": RobustRule(trimmed_mean, ("graph", "star")),
    "median": RobustRule(median, ("graph", "star")),
    "krum": RobustRule(krum, ("graph", "star")),
}
