"""Simulated faults: peers offline for a round, lost messages, and stragglers against a deadline; and peers
away at a round's start by the run's churn (p2pfl.comm.availability), who sit it out as offline ones do.

Every draw is keyed by (seed, kind, round, peer or link) like every other random choice, so the same
seed gives the same faults on any number of ranks. The transport applies them to each exchange: an
offline peer sends nothing; a lost or late message is sent (and counted) but never arrives. Algorithms
then proceed with what arrived (see each algorithm's `round`).

The simulated clock: a peer's local work in a round takes 1 time unit, a straggler's takes
--slow-factor units; a message arrives when its sender has finished, and one that would arrive after
--round-deadline units is dropped. A round's simulated time is the deadline or, if earlier, the time
its last participant finished.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from p2pfl.comm.availability import Availability
from p2pfl.seeding import uniform_draw as _uniform


@dataclass(frozen=True)
class Faults:
    seed: int
    peers: int  # nodes from `peers` on (a star's server) never go offline or straggle
    drop_peers: float = 0.0
    drop_links: float = 0.0
    slow_peers: float = 0.0
    slow_factor: float = 4.0
    deadline: float = 2.0
    availability: Availability | None = None  # peers that leave and come back (churn): away ones sit rounds out

    @property
    def faulty(self) -> bool:
        """Whether any of the faults proper is asked for (the unit clock's deadline is theirs)."""
        return bool(self.drop_peers or self.drop_links or self.slow_peers)

    @property
    def active(self) -> bool:
        return self.faulty or self.availability is not None

    @lru_cache(maxsize=65536)
    def offline(self, round_index: int, peer: int) -> bool:
        if peer >= self.peers:
            return False
        if self.availability is not None and self.availability.absent_in_round(round_index, peer):
            return True
        return self.drop_peers > 0 and _uniform(self.seed, "drop-peer", round_index, peer) < self.drop_peers

    @lru_cache(maxsize=65536)
    def finish_time(self, round_index: int, peer: int) -> float:
        slow = (
            peer < self.peers
            and self.slow_peers > 0
            and _uniform(self.seed, "slow-peer", round_index, peer) < self.slow_peers
        )
        return self.slow_factor if slow else 1.0

    def delivered(self, round_index: int, src: int, dst: int, phase: str) -> bool:
        """Whether the message src -> dst of this round's phase arrives (both online, not lost, in time)."""
        if self.offline(round_index, src) or self.offline(round_index, dst):
            return False
        if self.drop_links > 0 and _uniform(self.seed, f"drop-link/{phase}", round_index, src, dst) < self.drop_links:
            return False
        return self.finish_time(round_index, src) <= self.deadline

    def sends(self, round_index: int, src: int) -> bool:
        """An offline peer sends nothing (nothing counted); everyone else sends, delivered or not."""
        return not self.offline(round_index, src)

    def taking_part(self, round_index: int, peers: range | list[int]) -> list[int]:
        return [p for p in peers if not self.offline(round_index, p)]

    def simulated_time(self, round_index: int, peers: range | list[int]) -> float:
        finish = [self.finish_time(round_index, p) for p in self.taking_part(round_index, peers)]
        return min(self.deadline, max(finish, default=0.0))
