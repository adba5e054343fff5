"""Asynchronous gossip on the virtual clock (AD-PSGD, gossip learning) and churn: the clock decides how many
works a peer finishes and what its messages weigh, peers that finish together train as one batch, stragglers
take fewer steps, an away peer neither trains nor hears, and one process equals three ranks and resumes
equal with all of it on."""

import math

import pytest

import p2pfl
from p2pfl.comm.availability import Availability, read_availability
from p2pfl.errors import UserError
from p2pfl.models import build_model, count_parameters
from tests.helpers import make_context

RING = dict(dataset="synthetic", peers=8, topology="ring", static=True, progress=False)


def weights_of(ctx) -> int:
    return count_parameters(build_model(ctx.cfg.model, ctx.data.input_shape, ctx.data.n_classes, ctx.cfg))


def test_ad_psgd_finishes_the_works_its_clock_allows_and_each_exchange_is_two_models():
    """Step 0.1 s, latency 0.01 s each way: a peer's works end at 0.1 + 0.12 k, 8 of them by 1.0 s; each
    is one model to the partner and one back."""
    ctx, _ = make_context(algo="ad-psgd", peers=8)
    run = p2pfl.simulate("ad-psgd", out=None, rounds=2, step_time=0.1, link_latency=0.01, round_time=1.0, **RING)
    works = sum(1 for k in range(20) if 0.1 + 0.12 * k <= 1.0)
    assert works == 8
    assert run.rows[0]["bytes_sent"] == 8 * works * 2 * 4 * weights_of(ctx)
    assert [r["sim_time_s"] for r in run.rows] == [1.0, 2.0]


def test_gossip_learning_pushes_one_model_per_work_and_its_round_is_the_median_work():
    ctx, _ = make_context(algo="gossip-learning", peers=8)
    works = [0.01 * math.ceil(len(s) / 10) for s in ctx.shards]  # one local epoch of batch 10, 0.01 s a step
    median = sorted(works)[3:5]
    run = p2pfl.simulate("gossip-learning", out=None, rounds=1, step_time=0.01, **RING)
    assert run.rows[0]["sim_time_s"] == pytest.approx(sum(median) / 2)
    span = 3.05 * sum(median) / 2  # off the works' multiples, so that no push falls on the horizon
    run = p2pfl.simulate("gossip-learning", out=None, rounds=1, step_time=0.01, round_time=span, **RING)
    pushes = sum(math.floor(span / w) for w in works)
    assert run.rows[0]["bytes_sent"] == pushes * 4 * weights_of(ctx)


def test_peers_that_finish_together_are_trained_as_one_batch(monkeypatch):
    ctx, algo = make_context(algo="ad-psgd", peers=8)
    calls = []
    train = ctx.train
    monkeypatch.setattr(ctx, "train", lambda *a, **k: calls.append(len(a[2])) or train(*a, **k))
    for k in range(3):
        algo.round(k)
    assert calls == [8, 8, 8, 8]  # the first steps, then every peer's next step once a round: not a loop over events


def test_stragglers_take_fewer_steps_and_fast_peers_do_not_wait_for_them():
    ctx, algo = make_context(algo="ad-psgd", peers=8, step_time=0.1, slower_peers=0.25, slower_by=10.0)
    for k in range(10):
        algo.round(k)
    slow = [p for p in range(8) if ctx.network.step_times[p] > 0.5]
    fast = [p for p in range(8) if p not in slow]
    assert len(slow) == 2
    assert max(algo.started[p] for p in slow) <= 2 and min(algo.started[p] for p in fast) >= 9


def test_availability_spans_from_a_trace():
    away = Availability({1: [(2.0, 5.0), (7.0, math.inf)]})
    assert away.present(1, 1.9) and not away.present(1, 2.0) and away.present(1, 5.0)
    assert away.back_at(1, 3.0) == 5.0 and away.back_at(1, 8.0) == math.inf and away.back_at(0, 3.0) == 3.0
    assert away.away_within(1, 0.0, 2.0) and not away.away_within(1, 5.0, 6.9) and away.away_within(1, 6.0, 7.0)


def test_seeded_churn_is_the_seeds_and_takes_the_share_asked():
    a = Availability.seeded(3, 20, 0.25, 5.0, 5.0)
    b = Availability.seeded(3, 20, 0.25, 5.0, 5.0)
    grid = [(p, t / 2) for p in range(20) for t in range(100)]
    assert [a.present(p, t) for p, t in grid] == [b.present(p, t) for p, t in reversed(grid)][::-1]
    churning = {p for p, t in grid if not a.present(p, t)}
    assert len(churning) == 5
    share_away = sum(not a.present(p, t) for p, t in grid if p in churning) / (100 * 5)
    assert 0.25 < share_away < 0.75  # mean 5 s present, 5 s away


def test_a_synchronous_peer_away_at_its_rounds_start_sits_it_out(tmp_path):
    trace = tmp_path / "away.csv"
    trace.write_text("peer,leave,return\n3,1.5,3.5\n5,0.5,\n")
    run = p2pfl.simulate("dpsgd", out=None, rounds=4, availability_file=str(trace), **RING)
    assert [sorted(r["offline"]) for r in run.rows] == [[], [5], [3, 5], [3, 5]]  # rounds start at 0, 1, 2, 3 s


def test_an_asynchronous_peer_away_loses_its_work_and_hears_nothing(tmp_path):
    trace = tmp_path / "away.csv"
    trace.write_text("2,0.05,\n")  # peer 2 leaves during its first step, for good
    ctx, algo = make_context(algo="ad-psgd", availability_file=str(trace), step_time=0.1, round_time=1.0, **RING)
    start = algo.ctx.flat[2].clone() if 2 in algo.ctx.row else None
    for k in range(3):
        algo.round(k)
    assert algo.started[2] == 1 and algo.x[2].equal(start)  # its one work lost, and nobody averaged with it
    assert min(algo.started[p] for p in range(8) if p != 2) >= 29  # 3 s of 0.1 s steps


@pytest.mark.parametrize(
    "text, message",
    [
        ("1,2\n", "holds 2 fields"),
        ("9,1,2\n", "peer 9 is not one of the run's peers"),
        ("1,-1,2\n", "leaves at -1.0"),
        ("1,3,2\n", "returns at 2.0"),
        ("1,nan,2\n", "leaves at nan"),
        ("1,1,4\n1,3,5\n", "overlap"),
    ],
)
def test_an_availability_file_is_checked_where_it_enters(tmp_path, text, message):
    path = tmp_path / "away.csv"
    path.write_text(text)
    with pytest.raises(UserError, match=message):
        read_availability(str(path), 8)


@pytest.mark.parametrize(
    "algo, settings, message",
    [
        ("ad-psgd", dict(momentum=0.9), "steps without momentum"),
        ("ad-psgd", dict(drop_peers=0.1), "--drop-peers acts on synchronous rounds"),
        ("gossip-learning", dict(mixing="metropolis"), "averages pairs equally"),
        ("dpsgd", dict(churn=0.2, availability_file="x.csv"), "give one"),
        ("fedavg", dict(churn=0.2), "a star's are not modelled"),
        ("ad-psgd", dict(round_time=0.0), "--round-time must be positive"),
    ],
)
def test_asynchronous_and_churn_settings_refused_in_one_line(algo, settings, message):
    with pytest.raises(UserError, match=message):
        p2pfl.simulate(algo, out=None, dataset="synthetic", peers=8, rounds=1, progress=False, **settings)


def test_models_in_flight_when_a_round_ends_are_state_a_checkpoint_keeps():
    """The slow links of the three-rank case below (1e5 B/s: a model takes 0.3 s) leave pushes in flight at
    the rows' ends, so that its resume carries them."""
    ctx, algo = make_context(
        algo="gossip-learning", peers=9, kappa=2, local_epochs=1, step_time=0.1, link_latency=0.01, link_bandwidth=1e5
    )
    assert algo.state["in_flight"] == "pooled"
    in_flight = []
    for k in range(3):
        algo.round(k)
        in_flight.append(len(algo.in_flight))
    assert max(in_flight) > 0 and all(dst in ctx.row for _, dst, _, _ in algo.in_flight)


NETWORK = ["--step-time", "0.1", "--step-time-spread", "0.5", "--slower-peers", "0.25", "--link-latency", "0.01"]
NETWORK += ["--link-bandwidth", "1e5", "--drop-links", "0.2", "--churn", "0.4", "--churn-online", "0.3"]
NETWORK += ["--churn-offline", "0.2"]


@pytest.mark.mpi
@pytest.mark.parametrize("algo", ["ad-psgd", "gossip-learning", "dpsgd"])
def test_async_and_churn_are_the_same_on_three_ranks_and_resume_equal(tmp_path, algo):
    """Slow links (1e5 B/s: a model takes longer than a round), so that models are in flight when round 1
    ends and the resumed run must carry them."""
    from p2pfl import testing

    args = ["--algo", algo, "--dataset", "synthetic", "--peers", "9", "--kappa", "2", "--local-epochs", "1"]
    args += ["--rounds", "3", "--no-progress", *NETWORK]
    testing.check_layout_invariance(args, tmp_path / "layout")
    testing.check_resume(args, tmp_path / "resume")


def test_the_run_header_states_the_network_model_and_the_asynchronous_round(tmp_path):
    p2pfl.simulate(
        "ad-psgd",
        out=tmp_path / "run",
        rounds=1,
        step_time=0.1,
        slower_peers=0.25,
        link_latency=0.01,
        link_bandwidth=1e6,
        churn=0.25,
        **RING,
    )
    header = (tmp_path / "run" / "config.toml").read_text()
    assert "# asynchronous: a round is 0.1 virtual seconds" in header
    assert (
        "# network model: a local step 0.1 s (median; 0.1 to 1 s over the peers), links 0.01 s + bytes at 1e+06 "
        "B/s, 2 peers churning (present 20 s, away 10 s on average)" in header
    )
