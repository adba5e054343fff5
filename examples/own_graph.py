"""Bring a graph of your own, as a function and as a weighted file, and set it beside the built-in families:
its spectral gap before any training, then D-PSGD on each graph.

    python examples/own_graph.py [--peers 16] [--rounds 30] [--dataset synthetic]

A function is called for every round with (peers, round, seed) and returns a networkx graph on the nodes
0..peers-1; here two rings joined by two bridges, whose bridges move each round (drawn from the seed, so
every MPI rank builds the same graph). A file is read once; its edges' `weight` is the mixing matrix under
`--mixing given` (an edge u-v: what v takes from u, and u from v; each peer keeps the rest).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

import networkx as nx

import p2pfl
from p2pfl.measure.graph_diagnostics import graph_gap
from topologies import build_graph


def two_rings(peers: int, round_index: int, seed: int) -> nx.Graph:
    """Two rings of half the peers each, joined by two bridges that move with the round's seed."""
    half = peers // 2
    graph = nx.cycle_graph(half)
    graph.add_edges_from((half + i, half + (i + 1) % (peers - half)) for i in range(peers - half))
    draw = random.Random(seed)
    graph.add_edges_from((draw.randrange(half), half + draw.randrange(peers - half)) for _ in range(2))
    return graph


def weighted_file(peers: int, folder: Path) -> Path:
    """A ring whose edges weigh 0.3 (each peer keeps 0.4), as an edge list 'u v weight'."""
    path = folder / "ring-weighted.txt"
    path.write_text("".join(f"{i} {(i + 1) % peers} 0.3\n" for i in range(peers)))
    return path


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--peers", type=int, default=16)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--dataset", default="synthetic")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        graphs = {
            "two rings (a function)": dict(topology=two_rings),
            "weighted ring (a file, --mixing given)": dict(
                topology_file=str(weighted_file(args.peers, Path(folder))), mixing="given"
            ),
            "ring": dict(topology="ring", static=True),
            "torus": dict(topology="torus", static=True),
            "exponential": dict(topology="exponential", static=True),
        }
        gaps = {
            "two rings (a function)": graph_gap(two_rings(args.peers, 0, 0), "metropolis"),
            "weighted ring (a file, --mixing given)": graph_gap(
                nx.read_weighted_edgelist(
                    graphs["weighted ring (a file, --mixing given)"]["topology_file"], nodetype=int
                ),
                "given",
            ),
            **{
                name: graph_gap(build_graph(name, args.peers), "metropolis" if name != "exponential" else "uniform")
                for name in ("ring", "torus", "exponential")
            },
        }
        rows = []
        for name, graph in graphs.items():
            result = p2pfl.simulate(
                "dpsgd", peers=args.peers, rounds=args.rounds, dataset=args.dataset, out=None, progress=False, **graph
            )
            last = result.rows[-1]
            rows.append(
                {"graph": name, "gap": gaps[name], "acc": last["test_acc"], "consensus": last["consensus_distance"]}
            )
    print(f"D-PSGD, {args.peers} peers, {args.rounds} rounds, {args.dataset}:")
    print(f"  {'graph':42s} {'spectral gap':>12s} {'test acc':>9s} {'consensus distance':>19s}")
    for row in rows:
        print(f"  {row['graph']:42s} {row['gap']:12.4f} {100 * row['acc']:8.1f}% {row['consensus']:19.3g}")
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
