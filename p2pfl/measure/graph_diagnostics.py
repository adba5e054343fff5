"""Per-round diagnostics of a decentralized run: how far the peers are from agreeing, how fast the
round's graph mixes, and how evenly traffic spreads over its edges.

All are computed on rank 0 from the round's graph (a pure function of seed and round) and the ranks'
counters, so they are the same on any number of ranks; the consensus distance is in p2pfl.measure.facts.
"""

from __future__ import annotations

from typing import Sequence

import networkx as nx
import numpy as np

from topologies import as_matrix, mixing_weights


def mixing_matrix(graph: nx.Graph, kind: str, sample_counts: Sequence[int] | None = None) -> np.ndarray:
    """The round's mixing matrix W (n, n): row i holds W_ij for j in i's neighbourhood."""
    return as_matrix(mixing_weights(graph, kind, sample_counts), graph.number_of_nodes())


def spectral_gap(matrix: np.ndarray, directed: bool = False) -> float:
    """1 - |lambda_2|, the second largest eigenvalue modulus of a row-stochastic W: how much one round
    of averaging shrinks disagreement (0 for a disconnected graph, 1 for the complete graph's mean). A
    directed graph's W need not be symmetric nor normal: 1 minus its second largest singular value."""
    if len(matrix) < 2:
        return 1.0
    if directed:
        moduli = np.linalg.svd(matrix, compute_uv=False)
    else:
        moduli = np.sort(np.abs(np.linalg.eigvals(matrix)))[::-1]
    return float(f"{max(0.0, 1.0 - moduli[1]):.8g}")


def graph_gap(graph: nx.Graph, mixing: str, sample_counts: Sequence[int] | None = None) -> float:
    """The spectral gap of a graph's mixing matrix."""
    return spectral_gap(mixing_matrix(graph, mixing, sample_counts), graph.is_directed())


def edge_bytes(graph: nx.Graph, links: dict[tuple[int, int], int]) -> dict[str, float]:
    """Bytes sent over each edge of the round's graph (both directions, every phase): min, mean and max.
    Like bytes_sent, a message lost on the way counts; an edge whose ends were both offline counts 0."""
    sizes = [links.get((min(a, b), max(a, b)), 0) for a, b in graph.edges]
    if not sizes:
        return {}
    return {
        "edge_bytes_min": int(min(sizes)),
        "edge_bytes_mean": round(sum(sizes) / len(sizes), 1),
        "edge_bytes_max": int(max(sizes)),
    }
