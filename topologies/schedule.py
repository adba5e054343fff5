"""Which graph is used in round k: a pure function of (seed, k), so every rank builds it locally."""

from __future__ import annotations

from functools import lru_cache
from typing import Callable

import networkx as nx

from topologies.families import Family, GraphSpec


class TopologySchedule:
    """graph_seed(key) is the seed of the graph drawn for key (0 when static, else the round): the caller's
    keyed seed, so that the package depends on no one's seeding. A family drawn by round (one-peer
    exponential, a user's function) still gets each round, static or not; one placed once (one-peer
    exponential) gets the seed of key 0 every round."""

    def __init__(self, family: Family, n: int, spec: GraphSpec, graph_seed: Callable[[int], int], static: bool = False):
        family.check(n, spec)
        self.family, self.n, self.spec, self.graph_seed = family, n, spec, graph_seed
        self.static = static or family.fixed

    @property
    def varies(self) -> bool:
        """Whether rounds may see different graphs."""
        return not self.static or self.family.by_round

    def graph(self, round_index: int) -> nx.Graph:
        key = 0 if self.static or self.family.placed_once else round_index
        return self._graph(key, round_index if self.family.by_round else 0)

    @lru_cache(maxsize=4)
    def _graph(self, key: int, round_index: int) -> nx.Graph:
        return self.family.graph(self.n, round_index, self.spec, self.graph_seed(key))
