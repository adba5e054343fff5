import networkx as nx
import numpy as np
import pytest

from p2pfl.seeding import graph_seeds
from topologies import FAMILIES, GraphSpec, TopologySchedule, build_graph, mixing_weights
from topologies.drawing import draw_graph


def test_regular_graph_degrees_and_purity():
    a = build_graph("regular", 30, 5, seed=7)
    b = build_graph("regular", 30, 5, seed=7)
    assert all(d == 5 for _, d in a.degree)
    assert sorted(a.edges) == sorted(b.edges)


def test_schedule_is_pure_in_seed_and_round():
    s1 = TopologySchedule(FAMILIES["regular"], 20, GraphSpec(kappa=4), graph_seeds(3))
    s2 = TopologySchedule(FAMILIES["regular"], 20, GraphSpec(kappa=4), graph_seeds(3))
    assert sorted(s1.graph(5).edges) == sorted(s2.graph(5).edges)
    assert sorted(s1.graph(0).edges) != sorted(s1.graph(1).edges)  # dynamic: a new graph each round
    static = TopologySchedule(FAMILIES["regular"], 20, GraphSpec(kappa=4), graph_seeds(3), static=True)
    assert sorted(static.graph(0).edges) == sorted(static.graph(9).edges)


@pytest.mark.parametrize("kind,n,edges", [("ring", 12, 12), ("chain", 12, 11), ("star", 12, 11), ("full", 6, 15)])
def test_simple_topologies(kind, n, edges):
    g = build_graph(kind, n, 0, seed=1)
    assert g.number_of_nodes() == n and g.number_of_edges() == edges and nx.is_connected(g)
    if kind == "ring":
        assert all(d == 2 for _, d in g.degree)
    if kind == "star":
        assert g.degree[n - 1] == n - 1  # the hub is the last node (a centralized run's server)


def test_erdos_renyi_mean_degree_and_connected():
    degrees = []
    for seed in range(20):
        g = build_graph("erdos-renyi", 100, 6, seed=seed)
        assert nx.is_connected(g)
        degrees.append(2 * g.number_of_edges() / 100)
    assert abs(np.mean(degrees) - 6) < 0.5


@pytest.mark.parametrize("kind", ["uniform", "metropolis", "sample-weighted"])
def test_mixing_rows_sum_to_one(kind):
    g = build_graph("erdos-renyi", 25, 4, seed=2)
    counts = list(range(10, 35))
    rows = mixing_weights(g, kind, counts)
    for i, row in rows.items():
        assert abs(sum(w for _, w in row) - 1) < 1e-12
        assert [j for j, _ in row] == sorted(list(g.neighbors(i)) + [i])


def test_metropolis_is_symmetric_doubly_stochastic():
    g = build_graph("erdos-renyi", 25, 4, seed=2)
    rows = mixing_weights(g, "metropolis")
    W = np.zeros((25, 25))
    for i, row in rows.items():
        for j, w in row:
            W[i, j] = w
    assert np.allclose(W, W.T) and np.allclose(W.sum(0), 1) and (W >= 0).all()


def test_uniform_weights_are_one_over_degree_plus_one():
    g = build_graph("regular", 10, 3, seed=0)
    assert all(w == 0.25 for row in mixing_weights(g).values() for _, w in row)


def test_drawing_writes_png(tmp_path):
    draw_graph(build_graph("regular", 30, 5, seed=0), tmp_path / "g.png")
    assert (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"


def test_a_graphs_fingerprint_is_its_edges_and_weights_not_the_order_they_were_added():
    from topologies import fingerprint

    one = nx.Graph([(0, 1), (1, 2), (2, 0)])
    other = nx.Graph([(2, 1), (0, 2), (1, 0)])
    assert fingerprint(one) == fingerprint(other)
    assert fingerprint(one) != fingerprint(nx.DiGraph(one))
    other.add_node(3)
    assert fingerprint(one) != fingerprint(other)
    weighted = nx.Graph(one)
    nx.set_edge_attributes(weighted, 0.5, "weight")
    assert fingerprint(weighted) == fingerprint(one)  # weights no mixing reads are no difference
    assert fingerprint(weighted, weighted=True) != fingerprint(one, weighted=True)
    other_weights = nx.Graph(weighted)
    other_weights[0][1]["weight"] = 0.25
    assert fingerprint(other_weights, weighted=True) != fingerprint(weighted, weighted=True)


class _Ranks:
    """Three ranks' gather and broadcast as seen from rank 0, rank 2 holding `other`'s digest."""

    size = 3

    def __init__(self, other):
        self.other = other

    def gather(self, digest):
        return [digest, digest, self.other]

    def bcast(self, value):
        return value


def test_a_graph_file_read_otherwise_on_another_rank_names_the_file_and_the_round(tmp_path):
    from types import SimpleNamespace

    from p2pfl.algorithms import REGISTRY
    from p2pfl.errors import UserError
    from p2pfl.runner.graph_schedule import check_same_graph
    from topologies import fingerprint

    schedule = TopologySchedule(FAMILIES["ring"], 6, GraphSpec(), graph_seeds(0), static=True)
    cfg = SimpleNamespace(
        algorithm=REGISTRY["dpsgd"], topology_file=str(tmp_path / "g.txt"), topology="file", mixing="uniform"
    )
    ctx = SimpleNamespace(cfg=cfg, schedule=schedule, transport=_Ranks(fingerprint(nx.path_graph(6))))
    with pytest.raises(UserError, match=r"--topology-file .*g.txt gave rank 2 a graph other than rank 0's in round 4"):
        check_same_graph(ctx, 3, 3)
    check_same_graph(ctx, 4, 3)  # a static graph is compared in the run's first round only
    ctx.transport.other = fingerprint(schedule.graph(3))
    check_same_graph(ctx, 3, 3)


def test_a_graph_file_over_its_bound_is_refused_before_it_is_parsed(tmp_path):
    """A valid 100 MB edge list took 50 s and 2.5 GB; the bound is checked on the file's size."""
    from topologies import GraphError
    from topologies.given import FILE_LIMIT, read_graph

    huge = tmp_path / "huge.txt"
    with huge.open("wb") as fh:
        fh.truncate(FILE_LIMIT + 1)  # sparse: nothing written
    with pytest.raises(GraphError, match=r"67,108,865 bytes, more than the 64 MiB a graph file may hold"):
        read_graph(huge)


def test_a_placed_family_is_drawn_by_its_placement(tmp_path):
    """A ring's adjacency, ordered by peer id, was dots scattered by the seeded labels; by placement it is
    the band along the diagonal, and a torus knows its grid."""
    from topologies.drawing import draw_graph

    ring = build_graph("ring", 12, seed=3)
    order = ring.graph["placement"]
    matrix = nx.to_numpy_array(ring, nodelist=order)
    assert all(matrix[t, (t + 1) % 12] == 1 for t in range(12)) and matrix.sum() == 24
    torus = build_graph("torus", 16, seed=3)
    assert torus.graph["grid"] == (4, 4)
    weighted = nx.Graph(ring)
    nx.set_edge_attributes(weighted, 0.3, "weight")
    for graph, name in ((torus, "torus.png"), (weighted, "weighted.png")):
        draw_graph(graph, tmp_path / name)
        assert (tmp_path / name).stat().st_size > 0
