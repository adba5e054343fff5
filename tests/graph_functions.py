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
    """A random 3-regular graph from an unseeded generator: another graph on each rank, almost always."""
    return nx.random_regular_graph(3, peers, seed=random.SystemRandom().randrange(2**32))


def no_arguments() -> nx.Graph:
    """A graph function of the wrong signature."""
    return nx.cycle_graph(4)
