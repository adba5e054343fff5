"""What a Byzantine peer sends to an honest neighbour, one function an attack.

The threat model is the one of He, Karimireddy and Jaggi (2022) and of their code
(epfml/byzantine-robust-decentralized-optimizer, codes/attacks.py): an attacker knows its target's
weights and the messages of the target's honest neighbours in this round, and may send each neighbour a
message of its own. p2pfl computes that message where the target receives it, from what the target heard
(so no rank needs another's peers and every layout of the peers gives the same bits); the bytes counted
are the attacker's message, of a dense row's size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class AttackView:
    """What an attacker may know when it sends to one honest neighbour, the target."""

    own: torch.Tensor  # the attacker's own weights, what it would send if it were honest
    target: torch.Tensor  # the target's weights
    honest: list[tuple[float, torch.Tensor]]  # the target's honest in-neighbours' messages and their W_ij
    byzantine_weight: float  # the target's weights W_ij summed over its Byzantine in-neighbours
    peers: int  # n, the peers of the whole network
    byzantine: int  # m, the Byzantine peers among them
    scale: float | None  # --attack-scale; None: the attack's paper's default
    generator: torch.Generator  # keyed by (seed, round, attacker, target)


Attack = Callable[[AttackView], torch.Tensor]


def sign_flip(view: AttackView) -> torch.Tensor:
    """Bit flipping: the attacker's weights negated (the authors' BitFlippingWorker)."""
    return -view.own


def gaussian(view: AttackView) -> torch.Tensor:
    """Gaussian noise of standard deviation 200 in every coordinate (Blanchard et al., NeurIPS 2017,
    section 5: the Gaussian Byzantine workers)."""
    noise = torch.randn(view.own.shape, generator=view.generator, dtype=torch.float64)
    return (noise * (200.0 if view.scale is None else view.scale)).to(view.own.dtype).to(view.own.device)


def _known(view: AttackView) -> torch.Tensor:
    """The target's weights and its honest neighbours' messages, stacked (the models the authors' ALIE
    and IPM attackers read)."""
    return torch.stack([view.target, *(x for _, x in view.honest)])


def alie_z(peers: int, byzantine: int) -> float:
    """A little is enough's z (Baruch, Baruch and Goldberg, NeurIPS 2019): s = floor(n/2 + 1) - m
    supporters are needed, and z the normal quantile of (n - m - s)/(n - m)."""
    supporters = peers // 2 + 1 - byzantine
    share = (peers - byzantine - supporters) / (peers - byzantine)
    share = min(max(share, 1e-12), 1 - 1e-12)
    return float(torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor(share, dtype=torch.float64)))


def alie(view: AttackView) -> torch.Tensor:
    """The known models' mean less z of their standard deviations, coordinate by coordinate: close enough
    to the honest models to pass a robust rule, and always on one side."""
    known = _known(view).double()
    z = alie_z(view.peers, view.byzantine) if view.scale is None else view.scale
    spread = known.std(0) if len(known) > 1 else torch.zeros_like(known[0])
    return (known.mean(0) - z * spread).to(view.own.dtype)


def ipm(view: AttackView) -> torch.Tensor:
    """Inner-product manipulation (Xie, Koyejo and Gupta, UAI 2020): -epsilon times the known models'
    mean, epsilon 0.1 as in the authors' code."""
    return (-(0.1 if view.scale is None else view.scale) * _known(view).double().mean(0)).to(view.own.dtype)


def dissensus(view: AttackView) -> torch.Tensor:
    """The dissensus attack (He, Karimireddy and Jaggi 2022): x_i - epsilon * sum_honest W_ik (x_k - x_i)
    / sum_byzantine W_ij, so that the target's average moves away from its honest neighbours by epsilon
    times their pull; epsilon 1.5 as in the authors' experiments."""
    target = view.target.double()
    pull = sum((w * (x.double() - target) for w, x in view.honest), torch.zeros_like(target))
    epsilon = 1.5 if view.scale is None else view.scale
    return (target - epsilon * pull / view.byzantine_weight).to(view.own.dtype)


def label_flip(view: AttackView) -> torch.Tensor:
    """Label flipping (data poisoning): the attacker trains on label C - 1 - y and sends its weights as an
    honest peer does (the authors' LabelFlippingWorker, 9 - y on 10 classes)."""
    return view.own


label_flip.poisons_labels = True  # the run flips the attacker's training labels before any round

ATTACKS: dict[str, Attack] = {
    "sign-flip": sign_flip,
    "gaussian": gaussian,
    "alie": alie,
    "ipm": ipm,
    "dissensus": dissensus,
    "label-flip": label_flip,
}
