"""Which graph is used in round k: a pure function of (seed, k), so every rank builds it locally."""

from __future__ import annotations

import hashlib
from functools import lru_cache
from typing import Callable

import networkx as nx

from topologies.families import Family, GraphSpec
from topologies.given import check_connected


class TopologySchedule:
    """graph_seed(key) is the seed of the graph drawn for key (0 when static, else the round): the caller's
    keyed seed, so that the package depends on no one's seeding. A family drawn by round (one-peer
    exponential, a user's function) still gets each round, static or not; one placed once (one-peer
    exponential) gets the seed of key 0 every round. With spec.topology_window B > 1 (a function's graphs)
    the round that ends a window checks that the window's graphs together connect the peers."""

    def __init__(self, family: Family, n: int, spec: GraphSpec, graph_seed: Callable[[int], int], static: bool = False):
        family.check(n, spec)
        self.family, self.n, self.spec, self.graph_seed = family, n, spec, graph_seed
        self.static = static or family.fixed

    @property
    def varies(self) -> bool:
        """Whether rounds may see different graphs."""
        return not self.static or self.family.by_round

    def graph(self, round_index: int) -> nx.Graph:
        graph = self._drawn(round_index)
        window = self.spec.topology_window
        if window > 1 and (round_index + 1) % window == 0 and self.n > 1:  # the window's union must connect
            union = graph.copy()
            for k in range(round_index + 1 - window, round_index):
                union.add_edges_from(self._drawn(k).edges)
            check_connected(
                union, f"{self.family.name} (rounds {round_index + 2 - window} to {round_index + 1} together)"
            )
        return graph

    def _drawn(self, round_index: int) -> nx.Graph:
        key = 0 if self.static or self.family.placed_once else round_index
        return self._graph(key, round_index if self.family.by_round else 0)

    @lru_cache(maxsize=4)
    def _graph(self, key: int, round_index: int) -> nx.Graph:
        return self.family.graph(self.n, round_index, self.spec, self.graph_seed(key))


def fingerprint(graph: nx.Graph, weighted: bool = False) -> str:
    """A digest of a graph's peers and edges (and their weights, where weighted: --mixing given reads
    them), equal for equal graphs on any machine: what the ranks compare to know that each built the same
    graph (each draws its own copy)."""
    directed = graph.is_directed()
    edges = sorted(
        ((u, v) if directed else tuple(sorted((u, v))), repr(w) if weighted else "")
        for u, v, w in graph.edges(data="weight")
    )
    text = repr((directed, sorted(graph.nodes), edges))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
