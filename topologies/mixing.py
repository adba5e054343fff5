"""Mixing weights W_ij for neighbour averaging. Each row sums to 1 and lists j in increasing order,
including i itself, so sums over a neighbourhood happen in the same order on every rank. On a directed
graph (an edge j -> i: i hears j) row i weighs what i hears: its in-neighbours."""

from __future__ import annotations

from typing import Sequence

import networkx as nx
import numpy as np

MIXINGS = ("uniform", "metropolis", "sample-weighted", "given")


def in_neighbours(graph: nx.Graph, i: int) -> list[int]:
    """The peers i hears from: its neighbours, or its predecessors on a directed graph."""
    return list(graph.predecessors(i) if graph.is_directed() else graph.neighbors(i))


def mixing_weights(
    graph: nx.Graph, kind: str = "uniform", sample_counts: Sequence[int] | None = None
) -> dict[int, list[tuple[int, float]]]:
    """uniform: 1/(deg_i+1) (NTK-DFL reference code; in-degree on a directed graph, so the one-peer
    exponential graph's W = (I + P)/2); metropolis: 1/(1+max(deg_i, deg_j)), the rest on i (symmetric,
    doubly stochastic; undirected graphs only; on a regular graph uniform's numbers to the bit); sample-weighted: n_j / sum of n over the neighbourhood
    (paper eq. 1); given: the edges' own "weight", the rest on i (a user's graph)."""
    if kind == "metropolis" and graph.is_directed():
        raise ValueError("metropolis weights need an undirected graph")
    rows: dict[int, list[tuple[int, float]]] = {}
    for i in graph.nodes:
        heard = in_neighbours(graph, i)
        hood = sorted(heard + [i])
        if kind == "uniform":
            weights = {j: 1.0 / len(hood) for j in hood}
        elif kind == "metropolis":
            weights = {j: 1.0 / (1 + max(graph.degree[i], graph.degree[j])) for j in hood if j != i}
            if all(graph.degree[j] <= graph.degree[i] for j in heard):  # uniform's row: its very numbers
                weights[i] = 1.0 / len(hood)
            else:
                weights[i] = 1.0 - sum(weights.values())
        elif kind == "sample-weighted":
            if sample_counts is None:
                raise ValueError("sample-weighted mixing needs the peers' sample counts")
            total = float(sum(sample_counts[j] for j in hood))
            weights = {j: sample_counts[j] / total for j in hood}
        elif kind == "given":
            weights = {j: float(graph.edges[j, i]["weight"]) for j in heard}
            weights[i] = 1.0 - sum(weights[j] for j in sorted(heard))
        else:
            raise ValueError(f"unknown mixing {kind!r}")
        rows[i] = [(j, weights[j]) for j in hood]
    return rows


Rows = dict[int, list[tuple[int, float]]]


def push_sum_weights(graph: nx.Graph) -> Rows:
    """Push-sum's column-stochastic weights (Kempe et al. 2003; SGP, Assran et al. 2019): peer j splits what
    it holds evenly over itself and its out-neighbours, so W_ij = 1/(outdeg_j + 1) and each column sums to 1
    (mass is kept, on any directed graph). Rows as mixing_weights': what i hears, in peer order."""
    out = graph.out_degree if graph.is_directed() else graph.degree
    return {i: [(j, 1.0 / (out[j] + 1)) for j in sorted(in_neighbours(graph, i) + [i])] for i in graph.nodes}


def lazy(rows: Rows) -> Rows:
    """(I + W)/2: half of each row kept at home, which moves W's eigenvalues from [-1, 1] into [0, 1]."""
    return {i: [(j, (w + 1.0) / 2 if j == i else w / 2) for j, w in row] for i, row in rows.items()}


def as_matrix(rows: Rows, n: int) -> np.ndarray:
    """W as a dense (n, n) array: row i holds W_ij for j in i's neighbourhood."""
    matrix = np.zeros((n, n))
    for i, row in rows.items():
        for j, w in row:
            matrix[i, j] = w
    return matrix
