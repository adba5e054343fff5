"""Graph functions (--topology tests.graph_functions:NAME) that break the rule that every rank builds
the same graph: the runs that take them must stop in one line."""

import os
import random

import networkx as nx


def rank_local_edge(peers: int, round_index: int, seed: int) -> nx.Graph:
    """A path 1-2-..-(peers-1)-0, closed into a ring by the edge 0-1 on rank 0 only: a difference inside
    rank 0's own peers, which no message of the other ranks would reveal."""
    graph = nx.cycle_graph(peers)
    if os.environ.get("OMPI_COMM_WORLD_RANK", "0") != "0":
        graph.remove_edge(0, 1)
    return graph


def unseeded(peers: int, round_index: int, seed: int) -> nx.Graph:
    """A ring with one chord drawn from an unseeded generator: a different graph on each rank."""
    graph = nx.cycle_graph(peers)
    graph.add_edge(0, random.SystemRandom().randrange(2, peers - 1))
    return graph


def no_arguments() -> nx.Graph:
    """A graph function of the wrong signature."""
    return nx.cycle_graph(4)
