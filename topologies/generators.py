"""Graph generators. Every graph is a pure function of (kind, n, kappa, seed)."""

from __future__ import annotations

import math

import networkx as nx
import numpy as np


MAX_CONNECT_TRIES = 1000
MIN_CONNECTED_SHARE = 0.02  # an Erdos-Renyi draw must be connected this often, or the graph is refused


class GraphError(ValueError):
    """A graph that cannot exist (or cannot be drawn connected): the caller turns it into its own one-line
    refusal (p2pfl: a UserError)."""


def connected_share(n: int, kappa: float) -> float:
    """About how often G(n, p = kappa/(n-1)) is connected: exp(-expected isolated peers), the classic
    limit (isolated peers are what disconnects a sparse random graph)."""
    return math.exp(-n * (1 - kappa / (n - 1)) ** (n - 1))


def check_graph(kind: str, n: int, kappa: float) -> None:
    """GraphError for graphs that cannot exist, checked before any work starts."""
    if kind == "regular":
        if kappa != int(kappa) or kappa < 1:
            raise GraphError(f"a kappa-regular graph needs a whole degree >= 1, got kappa={kappa}")
        if kappa >= n:
            raise GraphError(f"a {int(kappa)}-regular graph needs more than {int(kappa)} peers, got {n}")
        if (int(kappa) * n) % 2:
            raise GraphError(f"no {int(kappa)}-regular graph on {n} peers exists: kappa * peers must be even")
    elif kind == "erdos-renyi":
        if not 0 < kappa <= n - 1:
            raise GraphError(f"an Erdos-Renyi mean degree must be in (0, peers-1] = (0, {n - 1}], got {kappa}")
        if connected_share(n, kappa) < MIN_CONNECTED_SHARE:
            least = math.log(n / -math.log(MIN_CONNECTED_SHARE))
            raise GraphError(
                f"an Erdos-Renyi graph of mean degree {kappa:g} on {n} peers is almost never connected "
                f"(about {100 * connected_share(n, kappa):.2g}% of draws); use kappa >= {least:.1f}"
            )
    elif kind == "ring" and n < 3:
        raise GraphError(f"a ring needs at least 3 peers, got {n}")
    elif kind in ("star", "chain", "full") and n < 2:
        raise GraphError(f"a {kind} graph needs at least 2 peers, got {n}")


def build_graph(kind: str, n: int, kappa: float, seed: int) -> nx.Graph:
    """One graph on nodes 0..n-1. Ring and chain follow a seeded permutation, so a new seed
    gives new neighbours (as the NTK-DFL reference code's dynamic ring)."""
    rng = np.random.default_rng(seed)
    if kind == "regular":
        graph = nx.random_regular_graph(int(kappa), n, seed=int(rng.integers(2**31)))
    elif kind == "erdos-renyi":
        p = kappa / (n - 1)
        for _ in range(MAX_CONNECT_TRIES):  # redraw until connected, so averaging can mix everyone
            graph = nx.gnp_random_graph(n, p, seed=int(rng.integers(2**31)))
            if nx.is_connected(graph):
                break
        else:
            raise GraphError(
                f"no connected Erdos-Renyi graph of mean degree {kappa:g} on {n} peers in "
                f"{MAX_CONNECT_TRIES} draws; use a larger kappa"
            )
    elif kind in ("ring", "chain"):
        order = rng.permutation(n).tolist()
        graph = nx.Graph()
        graph.add_nodes_from(range(n))
        graph.add_edges_from(zip(order, order[1:] + (order[:1] if kind == "ring" else [])))
    elif kind == "star":
        graph = nx.relabel_nodes(nx.star_graph(n - 1), {i: (i - 1) % n for i in range(n)})  # hub: node n-1
    elif kind == "full":
        graph = nx.complete_graph(n)
    else:
        raise GraphError(f"unknown topology {kind!r}")
    graph.graph["kind"] = kind
    return graph
