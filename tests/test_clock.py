"""The virtual clock (p2pfl.comm.clock): a round's local work, then its messages over latency and
bandwidth, summed into sim_time_s; the faults' unit clock is the case without --step-time."""

import math

import networkx as nx
import pytest
import torch

import p2pfl
from p2pfl.comm.clock import Network, peer_step_times, read_step_times
from p2pfl.errors import UserError
from p2pfl.models import build_model, count_parameters
from topologies import GraphError
from topologies.given import check_link_attributes
from tests.helpers import make_context

RING = dict(dataset="synthetic", peers=8, topology="ring", static=True, progress=False)


def test_one_dense_dpsgd_round_lasts_a_step_a_latency_and_a_message_over_the_bandwidth():
    """The issue's constant model on a static ring of 8: 0.1 + 0.01 + one message's bytes / 1e6, a message
    being the MLP's float32 weights."""
    ctx, _ = make_context(algo="dpsgd", peers=8)
    weights = count_parameters(build_model(ctx.cfg.model, ctx.data.input_shape, ctx.data.n_classes, ctx.cfg))
    run = p2pfl.simulate("dpsgd", out=None, rounds=2, step_time=0.1, link_latency=0.01, link_bandwidth=1e6, **RING)
    assert run.rows[0]["sim_time_s"] == pytest.approx(0.1 + 0.01 + 4 * weights / 1e6, rel=1e-9)
    assert run.rows[1]["sim_time_s"] == pytest.approx(2 * (0.1 + 0.01 + 4 * weights / 1e6), rel=1e-9)
    assert run.final["sim_time_s"] == run.rows[-1]["sim_time_s"]


def test_local_steps_are_timed_each_and_more_gossip_steps_are_more_messages_in_turn():
    dfedavg = p2pfl.simulate("dfedavg", out=None, rounds=1, local_epochs=2, batch_size=50, step_time=0.1, **RING)
    ctx, _ = make_context(algo="dfedavg", peers=8)
    steps = max(2 * math.ceil(len(s) / 50) for s in ctx.shards)
    assert dfedavg.rows[0]["sim_time_s"] == pytest.approx(0.1 * steps)
    one = p2pfl.simulate("dpsgd", out=None, rounds=1, step_time=0.1, link_latency=0.5, **RING)
    three = p2pfl.simulate("dpsgd", out=None, rounds=1, step_time=0.1, link_latency=0.5, gossip_steps=3, **RING)
    assert one.rows[0]["sim_time_s"] == pytest.approx(0.6) and three.rows[0]["sim_time_s"] == pytest.approx(1.6)


def test_without_a_step_time_the_clock_is_the_faults_unit_clock():
    plain = p2pfl.simulate("dpsgd", out=None, rounds=3, **RING)
    assert [r["sim_time_s"] for r in plain.rows] == [1.0, 2.0, 3.0]
    faulty = p2pfl.simulate("dpsgd", out=None, rounds=6, drop_peers=0.2, slow_peers=0.3, slow_factor=3.0, **RING)
    assert [r["sim_time_s"] for r in faulty.rows] == pytest.approx(
        [sum(r["sim_time"] for r in faulty.rows[: k + 1]) for k in range(6)]
    )
    assert {r["sim_time"] for r in faulty.rows} >= {2.0}  # a straggler's 3 units, capped by the deadline


def test_a_graphs_edge_latency_and_bandwidth_time_its_messages(tmp_path):
    graph = nx.cycle_graph(4)
    nx.set_edge_attributes(graph, 0.01, "latency")
    nx.set_edge_attributes(graph, 1e6, "bandwidth")
    graph.edges[0, 1]["latency"] = 2.0
    path = tmp_path / "ring.graphml"
    nx.write_graphml(graph, path)
    run = p2pfl.simulate(
        "dpsgd", out=None, rounds=1, peers=4, topology_file=str(path), dataset="synthetic", progress=False
    )
    message = run.rows[0]["bytes_sent"] / 8
    assert run.rows[0]["sim_time_s"] == pytest.approx(1.0 + 2.0 + message / 1e6)


@pytest.mark.parametrize(
    "latency, bandwidth, message",
    [
        ([0.1, None, 0.1], None, "edge 1-2 has no latency, which other edges have"),
        ([0.1, -0.5, 0.1], None, "edge 1-2's latency must be at least 0"),
        ([0.1, float("nan"), 0.1], None, "edge 1-2's latency must be at least 0"),
        (None, [1e6, 0.0, 1e6], "edge 1-2's bandwidth must be above 0"),
        (None, [1e6, "fast", 1e6], "edge 1-2's bandwidth 'fast' is not a number"),
    ],
)
def test_edge_latency_and_bandwidth_are_checked_where_they_enter(latency, bandwidth, message):
    graph = nx.path_graph(4)
    for name, values in (("latency", latency), ("bandwidth", bandwidth)):
        for (u, v), value in zip(graph.edges, values or []):
            if value is not None:
                graph.edges[u, v][name] = value
    with pytest.raises(GraphError, match=message):
        check_link_attributes(graph, "the graph")


def test_step_times_spread_and_slower_peers_are_drawn_once_from_the_seed():
    times = peer_step_times(3, 20, 0.1, slower=0.25, slower_by=10.0)
    assert sorted(times) == [0.1] * 15 + [1.0] * 5
    assert times == peer_step_times(3, 20, 0.1, slower=0.25, slower_by=10.0)
    assert times != peer_step_times(4, 20, 0.1, slower=0.25, slower_by=10.0)
    spread = peer_step_times(0, 4000, 0.1, spread=0.5)
    logs = sorted(math.log(t / 0.1) for t in spread)
    assert logs[2000] == pytest.approx(0.0, abs=0.03)  # the median is --step-time
    assert (sum(x * x for x in logs) / len(logs)) ** 0.5 == pytest.approx(0.5, rel=0.05)
    network = Network(0, latency=0.01, bandwidth=1e6, spread=0.5)
    assert (
        network.message_time(2, 5, 1000)
        == network.message_time(5, 2, 1000)
        != Network(0, 0, 0.01, 1e6).message_time(2, 5, 1000)
    )


def test_a_step_time_file_is_read_and_checked(tmp_path):
    path = tmp_path / "steps.csv"
    path.write_text("peer,seconds\n0,0.5\n2,1.5  # slow\n1,0.25\n")
    assert read_step_times(str(path), 3) == (0.5, 0.25, 1.5)
    for text, message in [
        ("0,0.5\n1,0.2\n", "no step time for peer \\[2\\]"),
        ("0,0.5\n1,-1\n2,1\n", "peer 1's step time must be a positive number"),
        ("0,0.5\n1,nan\n2,1\n", "peer 1's step time must be a positive number"),
        ("0,0.5\n0,1\n", "peer 0 is given twice"),
        ("0,0.5\n7,1\n", "peer 7 is not one of the run's peers"),
        ("0,0.5,1\n", "line 1 holds 3 fields"),
    ]:
        path.write_text(text)
        with pytest.raises(UserError, match=message):
            read_step_times(str(path), 3)


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(step_time_spread=0.5), "--step-time-spread spreads --step-time"),
        (dict(step_time=0.1, slow_peers=0.2), "--slow-peers belongs to the faults' unit clock"),
        (dict(step_time=0.1, step_time_file="x.csv"), "give one"),
        (dict(step_time=0.1, peer_flops=1e9), "--step-time and --peer-flops both give the step time"),
        (dict(algo="fedavg", link_latency=0.1), "a star's clients download, train and upload"),
        (dict(link_bandwidth=0.0), "--link-bandwidth must be positive"),
    ],
)
def test_network_settings_refused_in_one_line(settings, message):
    algo = settings.pop("algo", "dpsgd")
    with pytest.raises(UserError, match=message):
        p2pfl.simulate(algo, out=None, dataset="synthetic", peers=8, rounds=1, progress=False, **settings)


NETWORK = ["--step-time", "0.1", "--step-time-spread", "0.5", "--slower-peers", "0.25", "--link-latency", "0.01"]
NETWORK += ["--link-bandwidth", "1e6", "--link-spread", "0.3", "--drop-links", "0.2"]


@pytest.mark.mpi
def test_the_clock_is_the_same_on_three_ranks_and_resumes_equal(tmp_path):
    from p2pfl import testing

    args = ["--algo", "dfedavg", "--dataset", "synthetic", "--peers", "9", "--kappa", "2", "--local-epochs", "1"]
    args += ["--rounds", "3", "--no-progress", *NETWORK]
    testing.check_layout_invariance(args, tmp_path / "layout")
    testing.check_resume(args, tmp_path / "resume")


def test_a_peers_flops_set_its_step_time_from_the_models_flops_a_step():
    """The MLP's minibatch of 10: forward 2 * 10 * (weights of its two layers), backward the weights'
    gradients (as much again) and the second layer's input gradient (the first's input needs none)."""
    from p2pfl.models.flops import step_flops

    ctx, _ = make_context(algo="dpsgd", peers=8)
    model = build_model(ctx.cfg.model, ctx.data.input_shape, ctx.data.n_classes, ctx.cfg)
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(layers) == 2
    matmul = [2 * 10 * m.in_features * m.out_features for m in layers]
    assert step_flops(model, ctx.data.input_shape, 10) == 2 * sum(matmul) + matmul[1]
    run = p2pfl.simulate("dpsgd", out=None, rounds=1, peer_flops=1e9, **RING)
    assert run.rows[0]["sim_time_s"] == pytest.approx(step_flops(model, ctx.data.input_shape, 10) / 1e9, rel=1e-9)
