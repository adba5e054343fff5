"""Averaging that keeps the peers' mean: doubly stochastic weights by default, directed graphs whose weights
would average to a weighted mean refused, the one-peer exponential graph on one placement, and a function's
graphs taken when they connect the peers over a window of rounds."""

import sys

import networkx as nx
import numpy as np
import pytest

import p2pfl
from p2pfl.errors import UserError
from topologies import FAMILIES, GraphSpec, TopologySchedule, as_matrix, mixing_weights

FUNCTIONS = """
import networkx as nx
import numpy as np


def four(n, k, seed):
    return nx.DiGraph([(0, 1), (1, 2), (2, 3), (3, 0), (0, 2), (0, 3), (1, 3)])


def matching(n, k, seed):
    order = np.random.default_rng(seed).permutation(n)
    graph = nx.Graph()
    graph.add_nodes_from(range(n))
    graph.add_edges_from((int(order[i]), int(order[i + 1])) for i in range(0, n - 1, 2))
    return graph


def halves(n, k, seed):
    return nx.disjoint_union(nx.cycle_graph(n // 2), nx.cycle_graph(n - n // 2))
"""


@pytest.fixture
def functions(tmp_path, monkeypatch):
    (tmp_path / "graph_functions.py").write_text(FUNCTIONS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "graph_functions", raising=False)
    return "graph_functions"


@pytest.mark.parametrize("graph", [nx.cycle_graph(8), nx.random_regular_graph(3, 10, seed=1), nx.hypercube_graph(3)])
def test_metropolis_is_uniform_to_the_bit_on_a_regular_graph(graph):
    graph = nx.convert_node_labels_to_integers(graph)
    assert mixing_weights(graph, "metropolis") == mixing_weights(graph, "uniform")


def test_averaging_algorithms_default_to_doubly_stochastic_weights_on_a_non_regular_graph():
    result = p2pfl.simulate("dpsgd", out=None, dataset="synthetic", peers=12, topology="erdos-renyi", rounds=1, kappa=3)
    assert result.config.mixing == "metropolis"
    graph = nx.erdos_renyi_graph(12, 0.3, seed=4)
    w = as_matrix(mixing_weights(graph, "metropolis"), 12)
    assert np.allclose(w.sum(0), 1) and np.allclose(w.sum(1), 1)
    ntk = p2pfl.simulate("ntk-dfl", out=None, dataset="synthetic", peers=6, rounds=1, kappa=2, ntk_taus=[50])
    assert ntk.config.mixing == "uniform"  # its paper's 1/(deg+1)


def test_a_directed_graph_that_would_average_to_a_weighted_mean_is_refused_naming_sgp(functions):
    with pytest.raises(UserError, match="not doubly stochastic.*--algo sgp.*--mixing given"):
        p2pfl.simulate("dpsgd", out=None, dataset="synthetic", peers=4, rounds=1, topology=f"{functions}:four")
    exponential = p2pfl.simulate("dpsgd", out=None, dataset="synthetic", peers=8, rounds=1, topology="exponential")
    assert exponential.config.mixing == "uniform"  # regular digraphs keep running


def test_one_peer_exponential_averages_exactly_over_a_period_without_static():
    schedule = TopologySchedule(FAMILIES["one-peer-exponential"], 16, GraphSpec(), lambda key: 7 + key)
    product = np.eye(16)
    for k in range(4):
        product = as_matrix(mixing_weights(schedule.graph(k), "uniform"), 16) @ product
    assert np.abs(product - 1 / 16).max() < 1e-15


def test_random_matchings_run_over_a_window_and_their_peers_come_together(functions):
    args = dict(dataset="synthetic", peers=8, rounds=40, topology=f"{functions}:matching", eval_every=10)
    with pytest.raises(UserError, match=r"matching \(round 1\): the graph is not connected"):
        p2pfl.simulate("dpsgd", out=None, **args)
    rows = p2pfl.simulate("dpsgd", out=None, topology_window=6, **args).rows
    assert rows[-1]["consensus_distance"] < rows[0]["consensus_distance"] / 5


def test_a_window_that_never_connects_the_peers_is_refused_before_any_work(functions):
    with pytest.raises(UserError, match=r"rounds 1 to 2 together\): the graph is not connected"):
        p2pfl.simulate(
            "dpsgd",
            out=None,
            dataset="synthetic",
            peers=8,
            rounds=5,
            topology=f"{functions}:halves",
            topology_window=2,
        )
    with pytest.raises(UserError, match="--topology-window applies to a function's graphs"):
        p2pfl.simulate("dpsgd", out=None, dataset="synthetic", peers=8, rounds=1, topology_window=3)


def test_at_256_peers_the_one_peer_exponential_period_rate_ranks_it_above_the_ring():
    """Its single rounds mix little (a gap near 1e-5 each), but a period of 8 averages exactly."""
    gaps = {}
    for topology in ("one-peer-exponential", "ring"):
        result = p2pfl.simulate(
            "dpsgd",
            out=None,
            dataset="synthetic",
            peers=256,
            samples_per_peer=4,
            test_samples=50,
            client_test_samples=2,
            rounds=1,
            topology=topology,
            progress=False,
        )
        gaps[topology] = result.final["spectral_gap"]
    assert gaps["one-peer-exponential"] == 1.0 and gaps["ring"] < 1e-3
