"""A run's threats: which peers are Byzantine (drawn from the seed), what they send, and how honest peers
average under them. Built once per run from the settings; the averaging of the algorithms that declare
`withstands_threats` goes through Threats.average, and the run's metrics leave the attackers out."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from p2pfl.errors import UserError
from p2pfl.plugins import call_plugin, is_ours, is_reference, load_function
from p2pfl.seeding import numpy_rng, torch_generator
from p2pfl.threats.attacks import ATTACKS, Attack, AttackView
from p2pfl.threats.robust import RULES, Neighbourhood, Rule

NONE = "none"  # --robust-aggregation: the algorithm's own mixing


def byzantine_count(byzantine: float, peers: int) -> int:
    """--byzantine as a number of peers: a count (2), or a share of the peers (0.1, rounded)."""
    if byzantine >= 1:
        if byzantine != int(byzantine):
            raise UserError(f"--byzantine {byzantine:g}: a count of peers is a whole number (a share is below 1)")
        count = int(byzantine)
    else:
        count = round(byzantine * peers)
    if count >= peers:
        raise UserError(f"--byzantine {byzantine:g} makes {count} of the {peers} peers Byzantine; leave one honest")
    return count


def attack_named(name: str) -> Attack:
    if is_reference(name):
        return load_function(name, "--attack", "view")
    if name not in ATTACKS:
        raise UserError(f"unknown attack {name!r}; choose one of: {', '.join(ATTACKS)}; or package.module:function")
    return ATTACKS[name]


def rule_named(name: str, family: str) -> Rule | None:
    """The rule --robust-aggregation names for a family of algorithms ("graph" or "star"); None: none."""
    if name == NONE:
        return None
    if is_reference(name):
        return load_function(name, "--robust-aggregation", "hood")
    fitting = [n for n, rule in RULES.items() if family in rule.applies]
    if name not in RULES:
        raise UserError(
            f"unknown robust aggregation {name!r}; choose one of: {NONE}, {', '.join(fitting)}; or package.module:function"
        )
    if family not in RULES[name].applies:
        raise UserError(
            f"--robust-aggregation {name} is a rule for the {RULES[name].applies[0]}; on the {family} choose one of: "
            f"{', '.join(fitting)}"
        )
    return RULES[name].function


@dataclass
class Threats:
    """The Byzantine peers and the rule, for every rank alike."""

    attackers: frozenset[int]
    attack: Attack
    attack_name: str
    rule: Rule | None
    rule_name: str
    bound: int | None  # --robust-bound; None: the largest count of Byzantine neighbours of an honest peer
    radius: float | None  # --clip-radius; None: ClippedGossip's rule
    scale: float | None  # --attack-scale; None: each attack's paper's
    peers: int
    seed: int

    @property
    def poisons_labels(self) -> bool:
        return bool(self.attackers) and getattr(self.attack, "poisons_labels", False)

    def honest_rows(self, peers: list[int]) -> list[int]:
        """The rows of a rank's peers that are honest, in order."""
        return [i for i, p in enumerate(peers) if p not in self.attackers]

    def bound_among(self, senders) -> int:
        """b for one aggregation at a star's server: --robust-bound, or the Byzantine clients among the
        senders (at least 1)."""
        return self.bound if self.bound is not None else max(1, sum(c in self.attackers for c in senders))

    def round_bound(self, in_neighbours) -> int:
        """b for a round: --robust-bound, or the most Byzantine in-neighbours any honest peer has (BRIDGE's
        b, known to every peer; at least 1, so that a rule without attackers still trims)."""
        if self.bound is not None:
            return self.bound
        most = max(
            (sum(j in self.attackers for j in in_neighbours(p)) for p in range(self.peers) if p not in self.attackers),
            default=0,
        )
        return max(1, most)

    def average(
        self,
        round_index: int,
        receiver: int,
        own: torch.Tensor,
        heard: list[tuple[int, float, torch.Tensor]],
        bound: int,
    ) -> torch.Tensor:
        """receiver's new weights from (sender, W_ij, message) in peer order, itself included: an attacker's
        message replaced by what its attack sends the receiver, then the rule (None: the weighted sum)."""
        if receiver in self.attackers:  # an attacker's own row is never measured: it averages as sent
            return _weighted(heard)
        honest = [(w, x) for j, w, x in heard if j != receiver and j not in self.attackers]
        byzantine_weight = sum(w for j, w, _ in heard if j in self.attackers)
        sent = [
            (
                j,
                w,
                self._attack(round_index, j, receiver, x, own, honest, byzantine_weight) if j in self.attackers else x,
            )
            for j, w, x in heard
        ]
        if self.rule is None:
            return _weighted(sent)
        own_weight = sum(w for j, w, _ in sent if j == receiver)
        hood = Neighbourhood(own, own_weight, [(w, x) for j, w, x in sent if j != receiver], bound, self.radius)
        return _called(f"--robust-aggregation {self.rule_name}", self.rule, hood, own)

    def _attack(self, round_index, attacker, receiver, message, target, honest, byzantine_weight) -> torch.Tensor:
        view = AttackView(
            own=message,
            target=target,
            honest=honest,
            byzantine_weight=byzantine_weight,
            peers=self.peers,
            byzantine=len(self.attackers),
            scale=self.scale,
            generator=torch_generator(self.seed, "attack", round_index, attacker, receiver),
        )
        return _called(f"--attack {self.attack_name}", self.attack, view, message)

    def poison(self, data, shards: list) -> list:
        """The attackers train on flipped labels, C - 1 - y: their samples are appended to the training set
        as copies with flipped labels, and their shards point there, so that an honest peer holding the same
        samples keeps the true labels. Returns the shards."""
        extra, out, start = [], list(shards), len(data.train_y)
        for p in sorted(self.attackers):
            extra.append(np.asarray(shards[p]))
            out[p] = np.arange(start, start + len(extra[-1]))
            start += len(extra[-1])
        index = torch.from_numpy(np.concatenate(extra)).long()
        data.train_x = torch.cat([data.train_x, data.train_x[index]])
        data.train_y = torch.cat([data.train_y, data.n_classes - 1 - data.train_y[index]])
        return out


def _weighted(terms: list[tuple[int, float, torch.Tensor]]) -> torch.Tensor:
    """sum_j W_ij x_j in the order given, from zero (as the plain mixing adds)."""
    out = torch.zeros_like(terms[0][2])
    for _, w, x in terms:
        out += w * x
    return out


def _called(where: str, function, argument, like: torch.Tensor) -> torch.Tensor:
    """An attack's or a rule's answer: p2pfl's own called as it is (its error is p2pfl's bug, a full
    traceback), a user's through call_plugin (one line and their frames), and either checked."""
    return _checked(function(argument) if is_ours(function) else call_plugin(where, function, argument), like, where)


def _checked(out, like: torch.Tensor, where: str) -> torch.Tensor:
    """What an attack or a rule returned, checked where it comes back: a tensor of the weights' shape."""
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(like.shape):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise UserError(f"{where} returned {got}; it must return a tensor of the weights' shape {tuple(like.shape)}")
    return out.to(like.dtype).to(like.device)


def threats_of(cfg, peers: int) -> Threats | None:
    """The run's threats (None where there are none): the attackers drawn from the seed, the attack and
    the rule loaded once."""
    count = byzantine_count(cfg.byzantine, peers)
    if count == 0 and cfg.robust_aggregation == NONE:
        return None
    chosen = numpy_rng(cfg.seed, "byzantine").choice(peers, size=count, replace=False) if count else []
    return Threats(
        attackers=frozenset(int(p) for p in chosen),
        attack=attack_named(cfg.attack),
        attack_name=cfg.attack,
        rule=rule_named(cfg.robust_aggregation, "star" if cfg.algorithm.centralized else "graph"),
        rule_name=cfg.robust_aggregation,
        bound=None if cfg.robust_bound == "auto" else int(cfg.robust_bound),
        radius=None if cfg.clip_radius == "auto" else float(cfg.clip_radius),
        scale=None if cfg.attack_scale == "auto" else float(cfg.attack_scale),
        peers=peers,
        seed=cfg.seed,
    )
