"""Peers that leave and come back (churn), on the virtual clock's seconds: from a trace file of
'peer,leave,return' lines, or a seeded on/off model in which a share of the peers alternate between
present and away for exponentially distributed spans of given means.

An absent peer neither trains nor sends, and messages to it are lost. A synchronous run asks at each
round's start (the virtual time the clock reached): a peer away then sits the round out, as an offline peer
of the simulated faults does. An asynchronous run asks at each event's own moment: a work during which its
peer was away is lost, and the peer starts anew when it returns.

Every span is drawn from (seed, 'churn', peer, span index) alone, so every layout and a resumed run see the
same comings and goings.
"""

from __future__ import annotations

import bisect
import math

from p2pfl.comm.clock import read_trace
from p2pfl.errors import UserError
from p2pfl.seeding import derive_seed, uniform_draw


class Availability:
    """When each peer is away: a sorted list of [leave, return) spans per peer (return inf: for good)."""

    def __init__(self, away: dict[int, list[tuple[float, float]]] | None = None, model=None):
        self._away = {p: sorted(spans) for p, spans in (away or {}).items()}
        self._model = model  # (seed, churning peers, mean online s, mean offline s): spans drawn as needed
        self._drawn: dict[int, float] = {}  # how far each churning peer's spans are drawn
        self.round_starts: dict[int, float] = {}  # a synchronous run's rounds' start times, set by the loop

    @classmethod
    def seeded(cls, seed: int, peers: int, share: float, online: float, offline: float) -> "Availability":
        """round(share * peers) peers drawn from the seed alternate: present for Exp(online) seconds, then
        away for Exp(offline), from a present start."""
        count = round(share * peers)
        order = sorted(range(peers), key=lambda p: derive_seed(seed, "churning-peer", p))
        return cls({p: [] for p in order[:count]}, (seed, online, offline))

    def _spans(self, peer: int, until: float) -> list[tuple[float, float]]:
        spans = self._away.get(peer, [])
        if self._model is None or peer not in self._away:
            return spans
        seed, online, offline = self._model
        while self._drawn.get(peer, 0.0) <= until:
            k = len(spans)
            start = spans[-1][1] if spans else 0.0
            leave = start + _exponential(seed, peer, 2 * k, online)
            spans.append((leave, leave + _exponential(seed, peer, 2 * k + 1, offline)))
            self._drawn[peer] = spans[-1][1]
        return spans

    def present(self, peer: int, t: float) -> bool:
        return self.back_at(peer, t) == t

    def back_at(self, peer: int, t: float) -> float:
        """t if peer is present at t, else when it returns (inf: never)."""
        spans = self._spans(peer, t)
        i = bisect.bisect_right(spans, (t, math.inf)) - 1  # the last span to leave by t
        return spans[i][1] if i >= 0 and t < spans[i][1] else t

    def away_within(self, peer: int, start: float, end: float) -> bool:
        """Whether peer is away at any moment of [start, end] (spans sorted and apart: the last one to leave
        by end is the only one that can reach past start)."""
        spans = self._spans(peer, end)
        i = bisect.bisect_right(spans, (end, math.inf))
        return i > 0 and spans[i - 1][1] > start

    def absent_in_round(self, round_index: int, peer: int) -> bool:
        """A synchronous round's question: is peer away when the round starts?"""
        return not self.present(peer, self.round_starts[round_index])


def _exponential(seed: int, peer: int, index: int, mean: float) -> float:
    return -mean * math.log(1.0 - uniform_draw(seed, "churn", peer, index))


def read_availability(path: str, peers: int) -> Availability:
    """Away spans from a CSV of 'peer,leave,return' lines (seconds of virtual time; an empty return or inf:
    it never comes back; a header line may lead; # starts a comment), checked where it enters."""
    where = f"--availability-file {path}"
    away: dict[int, list[tuple[float, float]]] = {}
    parse = lambda w: (int(w[0]), float(w[1]), math.inf if w[2] in ("", "inf") else float(w[2]))  # noqa: E731
    for number, _, (peer, leave, back) in read_trace(path, "--availability-file", "peer,leave,return", parse):
        if not 0 <= peer < peers:
            raise UserError(f"{where}: line {number}: peer {peer} is not one of the run's peers 0..{peers - 1}")
        if not (math.isfinite(leave) and leave >= 0) or math.isnan(back) or back <= leave:
            raise UserError(
                f"{where}: line {number}: peer {peer} leaves at {leave} and returns at {back}; a peer leaves at a "
                "time of 0 or more and returns later (empty or inf: never)"
            )
        away.setdefault(peer, []).append((leave, back))
    for peer, spans in away.items():
        spans.sort()
        for (_, back), (leave, _) in zip(spans, spans[1:]):
            if leave < back:
                raise UserError(f"{where}: peer {peer}'s spans away overlap (one leaves at {leave} before {back})")
    return Availability(away)
