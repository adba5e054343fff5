"""Muffliato's pairwise network DP against local DP as the network grows, from the accounting alone (no
training): ceil(ln n / gap) gossip steps a round on random 4-regular graphs with uniform weights, each
peer's DP-SGD steps as in docs/threats.md's experiment (Poisson-sampled at 32 / 200, noise multiplier 1,
300 rounds, delta 1e-5). Prints local DP's epsilon and the mean and largest pairwise epsilon over ordered
pairs, as a run's dp_epsilon_network counts them (p2pfl.threats.privacy, dp-accounting's RDP accountant).

    python examples/network_privacy.py 16 64 300
"""

import math
import sys

import networkx as nx
import numpy as np

from p2pfl.threats.privacy import epsilon, exposure, pairwise_epsilon, rounded_up
from topologies import as_matrix, mixing_weights

SAMPLING, NOISE, ROUNDS, DELTA = 32 / 200, 1.0, 300, 1e-5


def network(n: int, steps: int, mixing: np.ndarray, graph: nx.Graph) -> tuple[float, float]:
    """The mean and largest pairwise epsilon over ordered pairs u != v, one accountant answer per distinct
    exposure rounded up to 2 significant digits (an upper bound, coarser than a run's 4 digits, so that
    300 peers take minutes, not an hour)."""
    shares = exposure(mixing, steps, [list(graph.neighbors(v)) for v in range(n)])
    off = shares[~np.eye(n, dtype=bool)]
    values, counts = np.unique([rounded_up(s, digits=2) if s > 0 else 0.0 for s in off], return_counts=True)
    spent = np.array([pairwise_epsilon(SAMPLING, NOISE, s, ROUNDS, DELTA) for s in values])
    return float((spent * counts).sum() / counts.sum()), float(spent.max())


def main(sizes: list[int]) -> None:
    local = epsilon(SAMPLING, NOISE, ROUNDS, DELTA)
    print("| peers | spectral gap | gossip steps | local DP epsilon | network epsilon, mean over pairs | largest |")
    print("|---|---|---|---|---|---|")
    for n in sizes:
        graph = nx.random_regular_graph(4, n, seed=0)
        mixing = as_matrix(mixing_weights(graph, "uniform"), n)
        gap = 1 - np.sort(np.abs(np.linalg.eigvalsh(mixing)))[-2]
        steps = math.ceil(math.log(n) / gap)
        mean, largest = network(n, steps, mixing, graph)
        print(f"| {n} | {gap:.3f} | {steps} | {local:.3g} | {mean:.3g} | {largest:.3g} |", flush=True)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [16, 64, 300])
