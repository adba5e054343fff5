"""The graph families of the literature, the user's own graph (a function or a file), the spectral gap a run
writes, and the refusals of graphs that cannot run, each one line before any data is read."""

import json
import math
import sys

import networkx as nx
import numpy as np
import pytest

from p2pfl import testing
from p2pfl.measure.graph_diagnostics import graph_gap
from topologies import GraphError, build_graph, mixing_weights

SMALL = [
    "--dataset",
    "synthetic",
    "--samples-per-peer",
    "20",
    "--test-samples",
    "100",
    "--local-epochs",
    "1",
    "--no-progress",
]


def run(tmp_path, *args, name="run"):
    out = tmp_path / name
    result = testing.run_in_process([*SMALL, *args, "--out", str(out)])
    return result, out


# -- the families' definitions ----------------------------------------------------------------------------
def test_exponential_links_i_to_i_plus_powers_of_two():
    g = build_graph("exponential", 16, seed=3)
    assert g.is_directed() and all(d == 4 for _, d in g.out_degree) and all(d == 4 for _, d in g.in_degree)
    # placed by a seeded order: position t is a peer; its out-neighbours are the positions t + 1, 2, 4, 8
    order = np.random.default_rng(3).permutation(16).tolist()
    assert {order[(5 + h) % 16] for h in (1, 2, 4, 8)} == set(g.successors(order[5]))
    assert not build_graph("exponential", 16, seed=3, exponential_form="symmetric").is_directed()
    assert [d for _, d in build_graph("exponential", 12, seed=0).out_degree] == [4] * 12  # floor(log2 11) + 1


def test_one_peer_exponential_cycles_its_hops_and_averages_exactly_over_a_period():
    n, period = 16, 4
    graphs = [build_graph("one-peer-exponential", n, seed=1, round_index=k) for k in range(period)]
    assert all(all(d == 1 for _, d in g.in_degree) for g in graphs)
    assert graphs[0].edges != graphs[1].edges and set(graphs[0].edges) == set(
        build_graph("one-peer-exponential", n, seed=1, round_index=period).edges
    )
    product = np.eye(n)
    for g in graphs:
        W = np.zeros((n, n))
        for i, row in mixing_weights(g).items():
            assert sorted(w for _, w in row) == [0.5, 0.5]  # W = (I + P) / 2
            for j, w in row:
                W[i, j] = w
        product = W @ product
    assert np.allclose(product, 1 / n)  # the paper's point: exact averaging after log2(n) rounds


def test_torus_hypercube_and_small_world():
    torus = build_graph("torus", 12, seed=0)
    assert all(d == 4 for _, d in torus.degree) and torus.number_of_edges() == 24  # 3 x 4
    assert nx.is_isomorphic(build_graph("torus", 12, seed=0, torus_sides="2x6"), nx.grid_2d_graph(2, 6, periodic=True))
    cube = build_graph("hypercube", 16, seed=0)
    assert nx.is_isomorphic(cube, nx.hypercube_graph(4))
    world = build_graph("small-world", 30, kappa=4, seed=2, rewire=0.2)
    assert nx.is_connected(world) and world.number_of_edges() == 60
    assert build_graph("small-world", 30, kappa=4, seed=2, rewire=0.0).edges != world.edges
    for kind, n, settings, said in [
        ("hypercube", 12, {}, "power of 2"),
        ("torus", 13, {}, "two sides of at least 2"),
        ("torus", 12, {"torus_sides": "3x3"}, "holds 9 peers"),
        ("small-world", 12, {"kappa": 3}, "must be even"),
    ]:
        with pytest.raises(GraphError, match=said):
            build_graph(kind, n, **settings)


def test_spectral_gap_of_a_directed_graph_is_one_minus_its_second_singular_value():
    g = build_graph("exponential", 16, seed=0)
    assert graph_gap(g, "uniform") == pytest.approx(0.4)  # Ying et al.: sigma_2 = 1 - 2 / (1 + log2 n)
    cycle = nx.DiGraph([(0, 1), (1, 2), (2, 3), (3, 0)])  # W = (I + P)/2: doubly stochastic, not symmetric
    W = np.zeros((4, 4))
    for i, row in mixing_weights(cycle).items():
        for j, w in row:
            W[i, j] = w
    assert graph_gap(cycle, "uniform") == pytest.approx(1 - np.linalg.norm(W - 1 / 4, 2), abs=1e-8)


def test_a_w_that_is_not_doubly_stochastic_has_no_spectral_gap():
    """Its averaging goes to a weighted mean: no bound of the field uses its rate."""
    chain = nx.DiGraph([(0, 1), (1, 2), (2, 0), (0, 2)])  # in-degrees 1, 1, 2
    assert graph_gap(chain, "uniform") is None
    star = nx.star_graph(4)  # uniform on a non-regular undirected graph; metropolis keeps the mean
    assert graph_gap(star, "uniform") is None and 0 < graph_gap(star, "metropolis") < 1


# -- every family runs, and its gap is in the run folder -----------------------------------------------------
@pytest.mark.parametrize("kind", ["exponential", "one-peer-exponential", "torus", "hypercube", "small-world"])
def test_each_family_runs_dfedavg_on_16_peers_with_its_gap_in_the_run_folder(tmp_path, kind):
    result, out = run(tmp_path, "--algo", "dfedavg", "--topology", kind, "--peers", "16", "--rounds", "2")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    final = json.loads((out / "final.json").read_text())
    assert all(0 <= row["spectral_gap"] <= 1 for row in rows)
    if kind == "one-peer-exponential":  # the rate of one period's product: 4 rounds average 16 peers exactly
        assert final["spectral_gap"] == 1.0 and max(r["spectral_gap"] for r in rows) < 0.1
    else:
        assert final["spectral_gap"] == pytest.approx(sum(r["spectral_gap"] for r in rows) / len(rows), rel=1e-7)


def test_a_static_ring_of_16_has_the_textbook_gap(tmp_path):
    result, out = run(tmp_path, "--topology", "ring", "--static", "--peers", "16", "--rounds", "1")
    assert result.returncode == 0, result.stderr
    expected = 1 - (1 + 2 * math.cos(2 * math.pi / 16)) / 3
    assert json.loads((out / "final.json").read_text())["spectral_gap"] == pytest.approx(expected, abs=5e-8)
    assert round(expected, 4) == 0.0507


# -- the user's own graph -----------------------------------------------------------------------------------
@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module of the user's on the path: graph functions, and a dataset loader that must not be reached."""
    (tmp_path / "mygraphs.py").write_text(
        "import networkx as nx\n"
        "def ring(peers, round, seed):\n    return nx.cycle_graph(peers)\n"
        "def varying(peers, round, seed):\n    return nx.circulant_graph(peers, [1 + 2 * (round % 2)])\n"
        "def split(peers, round, seed):\n"
        "    return nx.disjoint_union(nx.complete_graph(peers // 2), nx.complete_graph(peers - peers // 2))\n"
        "def short(peers, round, seed):\n    return nx.cycle_graph(peers - 1)\n"
        "def loop(peers, round, seed):\n    g = nx.cycle_graph(peers); g.add_edge(2, 2); return g\n"
        "def broken(peers, round, seed):\n    return [1, 2]\n"
        "def raising(peers, round, seed):\n    raise RuntimeError('my own bug')\n"
        "def no_data(*args, **kwargs):\n    raise AssertionError('the data was read')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "mygraphs"
    sys.modules.pop("mygraphs", None)


def test_your_own_function_runs_and_may_vary_by_round(tmp_path, user_module):
    result, out = run(tmp_path, "--topology", f"{user_module}:varying", "--peers", "8", "--rounds", "2", "--save-edges")
    assert result.returncode == 0, result.stderr
    edges = [json.loads(line)["edges"] for line in (out / "edges.jsonl").read_text().splitlines()]
    assert edges[0] == [list(e) for e in sorted(nx.circulant_graph(8, [1]).edges)]
    assert edges[1] == [list(e) for e in sorted(nx.circulant_graph(8, [3]).edges)]


@pytest.mark.parametrize(
    "function,said",
    [
        ("split", "not connected (2 parts of 4, 4 peers"),
        ("short", "missing 7"),
        ("loop", "self-loop at peer 2"),
        ("broken", "returned list; a topology is a networkx Graph"),
        ("raising", "raised RuntimeError"),
    ],
)
def test_a_bad_function_graph_is_one_line_before_any_data(tmp_path, user_module, function, said):
    result, _ = run(
        tmp_path, "--topology", f"{user_module}:{function}", "--peers", "8", "--dataset", f"{user_module}:no_data"
    )
    assert result.returncode == 2 and said in result.stderr, result.stderr
    assert "the data was read" not in result.stderr
    if function != "raising":  # the user's own exception shows their frames on the lines after
        assert len(result.stderr.strip().splitlines()) == 1


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_topology_file_runs_with_its_given_weights(tmp_path):
    ring = "".join(f"{i} {(i + 1) % 6} 0.25\n" for i in range(6))
    result, out = run(
        tmp_path,
        "--topology-file",
        write(tmp_path, "edges.txt", ring),
        "--mixing",
        "given",
        "--peers",
        "6",
        "--rounds",
        "1",
    )
    assert result.returncode == 0, result.stderr
    expected = 1 - (0.5 + 0.5 * math.cos(2 * math.pi / 6))  # W = I/2 + (P + P^T)/4
    assert json.loads((out / "final.json").read_text())["spectral_gap"] == pytest.approx(expected, abs=1e-7)
    nx.write_graphml(nx.cycle_graph(6), tmp_path / "ring.graphml")
    result, _ = run(
        tmp_path, "--topology-file", str(tmp_path / "ring.graphml"), "--peers", "6", "--rounds", "1", name="graphml"
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "name,text,extra,said",
    [
        ("split.txt", "0 1\n1 2\n3 4\n4 5\n", [], "not connected"),
        ("missing.txt", "0 1\n1 2\n2 3\n3 4\n4 0\n", [], "missing 5"),
        ("loop.txt", "0 1\n1 2\n2 3\n3 4\n4 5\n5 0\n3 3\n", [], "self-loop at peer 3"),
        ("negative.txt", "".join(f"{i} {(i + 1) % 6} -0.1\n" for i in range(6)), ["--mixing", "given"], "negative"),
        ("heavy.txt", "".join(f"{i} {(i + 1) % 6} 0.6\n" for i in range(6)), ["--mixing", "given"], "sum to 1.2 > 1"),
        ("words.txt", "this is not a graph\n", [], "an edge list line reads"),
        ("weights.txt", "0 1 heavy\n", [], "the weight 'heavy' is not a number"),
        ("bad.graphml", "<graphml><oops", [], "not a readable graphml graph"),
        ("graph.csv", "0,1\n", [], "reads .txt"),
    ],
)
def test_a_bad_topology_file_is_one_line_before_any_data(tmp_path, user_module, name, text, extra, said):
    result, _ = run(
        tmp_path,
        "--topology-file",
        write(tmp_path, name, text),
        *extra,
        "--peers",
        "6",
        "--dataset",
        f"{user_module}:no_data",
    )
    assert result.returncode == 2 and said in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "args,said",
    [
        (["--algo", "ntk-dfl", "--topology", "exponential"], "--exponential-form symmetric"),
        (["--algo", "dispfl", "--topology", "one-peer-exponential"], "needs symmetric exchanges"),
        (["--topology", "exponential", "--mixing", "metropolis"], "needs an undirected graph"),
        (["--mixing", "given"], "carry none"),
        (["--topology", "hypercube"], "power of 2"),
        (["--topology", "no-such"], "unknown topology 'no-such'"),
        (["--algo", "choco"], "needs a static graph"),
        (["--algo", "choco", "--static", "--topology", "one-peer-exponential"], "changes every round"),
        (["--gossip-topk", "0.1", "--gossip-quant-bits", "4"], "two codecs"),
        (["--topology", "ring", "--torus-sides", "2x3"], "--torus-sides applies to --topology torus, not ring"),
        (["--topology", "torus", "--rewire", "0.3"], "--rewire applies to --topology small-world"),
    ],
)
def test_graphs_an_algorithm_cannot_run_are_refused_in_one_line(tmp_path, args, said):
    result, _ = run(tmp_path, "--peers", "6", *args)
    assert result.returncode == 2 and said in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_the_topology_list_in_the_docs_is_generated_from_the_registry():
    from pathlib import Path

    from p2pfl.docs import TOPOLOGY_BEGIN, TOPOLOGY_END, topology_list
    from topologies import FAMILIES

    page = (Path(__file__).resolve().parents[1] / "docs" / "topologies.md").read_text()
    assert page.split(TOPOLOGY_BEGIN, 1)[1].split(TOPOLOGY_END, 1)[0].strip() == topology_list().strip()
    assert all(f"`{name}`" in topology_list() for name in FAMILIES)
