"""Which graph is used in round k: a pure function of (seed, k), so every rank builds it locally."""
from __future__ import annotations

from functools import lru_cache

import networkx as nx

from p2pfl.seeding import derive_seed
from topologies.generators import build_graph, check_graph


class TopologySchedule:
    def __init__(self, kind: str, n: int, kappa: float, seed: int, static: bool = False):
        check_graph(kind, n, kappa)
        self.kind, self.n, self.kappa, self.seed, self.static = kind, n, kappa, seed, static

    def graph(self, round_index: int) -> nx.Graph:
        return self._graph(0 if self.static else round_index)

    @lru_cache(maxsize=4)
    def _graph(self, key: int) -> nx.Graph:
        return build_graph(self.kind, self.n, self.kappa, derive_seed(self.seed, "topology", key))

    def neighbours(self, round_index: int) -> dict[int, list[int]]:
        """Sorted neighbour lists, the order every sum over neighbours follows."""
        graph = self.graph(round_index)
        return {i: sorted(graph.neighbors(i)) for i in range(self.n)}
