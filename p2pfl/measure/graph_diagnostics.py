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


def keeps_mean(matrix: np.ndarray) -> bool:
    """Whether W is doubly stochastic (its columns sum to 1 too): only then does averaging keep the peers'
    mean, and only then is a gap the rate any bound of the field states."""
    return bool(np.abs(matrix.sum(0) - 1).max() <= 1e-9)


def spectral_gap(matrix: np.ndarray, directed: bool = False) -> float | None:
    """1 - ||W - 11^T/n||_2 for a doubly stochastic W: how much one round of averaging shrinks the peers'
    disagreement at worst (0 for a disconnected graph, 1 for the complete graph's mean). For a symmetric W
    (Metropolis, uniform on a regular graph, given weights on an undirected one) 1 - max(|lambda_2|, |lambda_n|),
    else 1 minus W's second largest singular value: either equals 1 - ||W - 11^T/n||_2.
    None for a W that is not doubly stochastic: it averages to a weighted mean, and no bound uses its rate."""
    if len(matrix) < 2:
        return 1.0
    if not keeps_mean(matrix):
        return None
    if directed or not np.array_equal(matrix, matrix.T):  # W's singular values: 1 and those of W - 11^T/n
        moduli = np.linalg.svd(matrix, compute_uv=False)
    else:  # symmetric: the second largest eigenvalue modulus
        moduli = np.sort(np.abs(np.linalg.eigvals(matrix)))[::-1]
    return float(f"{max(0.0, 1.0 - moduli[1]):.8g}")


_LAST_GAP: list = []  # [(graph, mixing, sample counts, gap)] of the last call


def graph_gap(graph: nx.Graph, mixing: str, sample_counts: Sequence[int] | None = None) -> float | None:
    """The spectral gap of a graph's mixing matrix (None where it does not keep the mean). The same graph
    object as the last call's (a static graph's, which the schedule keeps) gets the last answer: at 300
    peers an eigendecomposition takes about 55 ms, a round's metrics otherwise a few."""
    if _LAST_GAP and _LAST_GAP[0][0] is graph and _LAST_GAP[0][1:3] == (mixing, sample_counts):
        return _LAST_GAP[0][3]
    gap = spectral_gap(mixing_matrix(graph, mixing, sample_counts), graph.is_directed())
    _LAST_GAP[:] = [(graph, mixing, sample_counts, gap)]
    return gap


def period_gap(graphs: Sequence[nx.Graph], mixing: str, sample_counts: Sequence[int] | None = None) -> float | None:
    """For a graph that changes by design over a period of p rounds (the one-peer exponential graph):
    1 - ||W_p ... W_1 - 11^T/n||_2^(1/p), the per-round rate of one period's product, comparable with a
    static graph's gap (1 where a period averages exactly, as at a power of 2 peers). None where a round's
    W does not keep the mean."""
    n = graphs[0].number_of_nodes()
    product = np.eye(n)
    for graph in graphs:
        matrix = mixing_matrix(graph, mixing, sample_counts)
        if not keeps_mean(matrix):
            return None
        product = matrix @ product
    return float(f"{max(0.0, 1.0 - np.linalg.norm(product - 1 / n, 2) ** (1 / len(graphs))):.8g}")


def run_gap(rows: list[dict], period: Sequence[nx.Graph] | None, mixing: str, sample_counts=None) -> float | None:
    """final.json's spectral_gap: for a graph that changes by design, given one period of its rounds (the
    one-peer exponential graph), period_gap, which ranks it as it mixes (its single rounds mix little);
    else the rows' mean (a static graph's gap, or the mean over a time-varying graph's rounds); None where
    there is none (a star, a W that does not keep the mean)."""
    if period is not None:
        return period_gap(period, mixing, sample_counts)
    gaps = [row["spectral_gap"] for row in rows if "spectral_gap" in row]
    return float(f"{sum(gaps) / len(gaps):.8g}") if gaps else None


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
