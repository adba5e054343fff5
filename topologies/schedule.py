"""Which graph is used in round k: a pure function of (seed, k), so every rank builds it locally."""

from __future__ import annotations

from functools import lru_cache
from typing import Callable

import networkx as nx

from topologies.generators import build_graph, check_graph


class TopologySchedule:
    """graph_seed(key) is the seed of the graph drawn for key (0 when static, else the round): the caller's
    keyed seed, so that the package depends on no one's seeding."""

    def __init__(self, kind: str, n: int, kappa: float, graph_seed: Callable[[int], int], static: bool = False):
        check_graph(kind, n, kappa)
        self.kind, self.n, self.kappa, self.graph_seed, self.static = kind, n, kappa, graph_seed, static

    def graph(self, round_index: int) -> nx.Graph:
        return self._graph(0 if self.static else round_index)

    @lru_cache(maxsize=4)
    def _graph(self, key: int) -> nx.Graph:
        return build_graph(self.kind, self.n, self.kappa, self.graph_seed(key))

    def neighbours(self, round_index: int) -> dict[int, list[int]]:
        """Sorted neighbour lists, the order every sum over neighbours follows."""
        graph = self.graph(round_index)
        return {i: sorted(graph.neighbors(i)) for i in range(self.n)}
