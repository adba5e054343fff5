"""Byzantine peers, their attacks and the robust rules (p2pfl.threats): each rule and attack against its
formula on hand-made neighbourhoods, the metrics left to the honest peers, the refusals, and the headline:
sign flipping breaks D-PSGD and ClippedGossip withstands it."""

import math
from pathlib import Path
import sys

import numpy as np
import pytest
import torch

import p2pfl
from p2pfl.algorithms.base import Round
from p2pfl.errors import UserError
from p2pfl.measure.metrics import MetricsLog
from p2pfl.runner.loop import reported_model
from p2pfl.runner.round_row import RoundMeasure
from p2pfl.threats import ATTACKS, RULES, AttackView, Neighbourhood
from p2pfl.threats.attacks import alie_z
from tests.helpers import make_context

SMALL = dict(dataset="synthetic", peers=16, rounds=40, progress=False, eval_every=40)


def hood(own, heard, bound=1, radius=None, own_weight=None):
    own = torch.tensor(own, dtype=torch.float32)
    heard = [(w, torch.tensor(x, dtype=torch.float32)) for w, x in heard]
    weight = 1 - sum(w for w, _ in heard) if own_weight is None else own_weight
    return Neighbourhood(own, weight, heard, bound, radius)


def test_clipped_gossip_clips_moves_beyond_the_radius_and_by_default_the_farthest_neighbour():
    h = hood([0.0, 0.0], [(0.25, [3.0, 4.0]), (0.25, [0.6, 0.8]), (0.25, [0.0, -0.5])], radius=1.0)
    # (3, 4) is 5 away: clipped to (0.6, 0.8); the two others are within 1
    assert torch.allclose(
        RULES["clipped-gossip"].function(h), torch.tensor([0.25 * (0.6 + 0.6), 0.25 * (0.8 + 0.8 - 0.5)])
    )
    auto = RULES["clipped-gossip"].function(
        hood([0.0, 0.0], [(0.25, [3.0, 4.0]), (0.25, [0.6, 0.8]), (0.25, [0.0, -0.5])])
    )
    # b = 1: tau is the second largest distance, 1: the same as above
    assert torch.allclose(auto, RULES["clipped-gossip"].function(h))


def test_trimmed_mean_and_median_are_coordinate_wise_over_the_peer_and_its_neighbours():
    h = hood([1.0, 10.0], [(0.25, [2.0, 20.0]), (0.25, [100.0, -5.0]), (0.25, [3.0, 0.0])], bound=1)
    # per coordinate, drop the largest and the smallest: (2 + 3)/2 and (0 + 10)/2
    assert torch.equal(RULES["trimmed-mean"].function(h), torch.tensor([2.5, 5.0]))
    assert torch.equal(RULES["median"].function(h), torch.tensor([2.5, 5.0]))  # four values: the two middle ones' mean
    odd = hood([1.0], [(0.5, [7.0]), (0.25, [-3.0])], bound=5)  # 2b >= 3: b lowered to 1
    assert torch.equal(RULES["trimmed-mean"].function(odd), torch.tensor([1.0]))


def test_krum_takes_the_candidate_closest_to_its_nearest_others():
    h = hood([0.0], [(0.2, [0.1]), (0.2, [0.2]), (0.2, [50.0]), (0.2, [0.15])], bound=1)
    # n = 5, b = 1: each score sums the 2 smallest squared distances; 0.15's (0.05^2 * 2) is the least
    assert torch.equal(RULES["krum"].function(h), torch.tensor([0.15]))


def view(**kwargs):
    base = dict(
        own=torch.tensor([1.0, -2.0]),
        target=torch.tensor([0.0, 0.0]),
        honest=[(0.25, torch.tensor([1.0, 1.0])), (0.25, torch.tensor([3.0, -1.0]))],
        byzantine_weight=0.25,
        peers=20,
        byzantine=4,
        scale=None,
        generator=torch.Generator().manual_seed(0),
    )
    return AttackView(**{**base, **kwargs})


def test_attacks_follow_their_papers():
    assert torch.equal(ATTACKS["sign-flip"](view()), torch.tensor([-1.0, 2.0]))
    # dissensus: x_i - 1.5 * (0.25 (1, 1) + 0.25 (3, -1)) / 0.25
    assert torch.allclose(ATTACKS["dissensus"](view()), torch.tensor([-6.0, 0.0]))
    # ipm: -0.1 times the mean of the target and its honest neighbours, (4/3, 0)
    assert torch.allclose(ATTACKS["ipm"](view()), torch.tensor([-0.4 / 3, 0.0]))
    # ALIE: n = 20, m = 4: s = 11 - 4 = 7 supporters, z = Phi^-1((16 - 7) / 16)
    z = alie_z(20, 4)
    assert z == pytest.approx(0.15731, abs=1e-4)
    known = torch.tensor([[0.0, 0.0], [1.0, 1.0], [3.0, -1.0]])
    assert torch.allclose(ATTACKS["alie"](view()), known.mean(0) - z * known.std(0))
    noise = ATTACKS["gaussian"](view(scale=2.0))
    assert torch.equal(noise, ATTACKS["gaussian"](view(scale=2.0, generator=torch.Generator().manual_seed(0))))
    assert torch.equal(ATTACKS["label-flip"](view()), view().own)


def test_the_metrics_and_the_reported_model_are_the_honest_peers():
    """Attackers' rows at 1e6: the peers' mean, the consensus distance and the reported model are the 6
    honest peers' alone."""
    ctx, algorithm = make_context(byzantine=2, algo="dpsgd")
    attackers = sorted(ctx.threats.attackers)
    assert len(attackers) == 2
    honest = [i for i, p in enumerate(ctx.peers) if p not in ctx.threats.attackers]
    ctx.flat[attackers] = 1e6
    expected = ctx.flat[honest].double().mean(0)
    measure = RoundMeasure(ctx, MetricsLog(None))
    assert torch.allclose(measure.peers_mean(0, True), expected)
    assert torch.allclose(reported_model(ctx, algorithm).double(), expected, atol=1e-6)
    losses = torch.arange(8, dtype=torch.float32)
    row = measure.record(0, Round(losses), reported_model(ctx, algorithm), (0.0, 0.0), True)
    deviations = (ctx.flat[honest].double() - expected).square().sum()
    assert row["consensus_distance"] == pytest.approx(math.sqrt(float(deviations) / 6), rel=1e-6)
    assert row["train_loss"] == pytest.approx(float(losses[honest].mean()))


def test_sign_flip_breaks_dpsgd_and_clipped_gossip_withstands_it():
    clean = p2pfl.simulate("dpsgd", out=None, **SMALL).rows[-1]["test_acc"]
    attacked = p2pfl.simulate("dpsgd", out=None, byzantine=2, attack="sign-flip", **SMALL).rows[-1]["test_acc"]
    clipped = p2pfl.simulate(
        "dpsgd", out=None, byzantine=2, attack="sign-flip", robust_aggregation="clipped-gossip", **SMALL
    ).rows[-1]["test_acc"]
    assert attacked < clean - 0.3 and clipped > clean - 0.05


def test_on_the_star_sign_flipping_clients_break_fedavg_and_centered_clipping_withstands_them():
    """10 clients, 2 flipping their models' signs. (The coordinate-wise median does not withstand them on
    these Dirichlet-0.1 shards: it loses as much without attackers, 0.67 against 0.91.)"""
    star = dict(dataset="synthetic", peers=10, rounds=10, progress=False, eval_every=10, clients_per_round=0)
    clean = p2pfl.simulate("fedavg", out=None, **star).rows[-1]["test_acc"]
    attacked = p2pfl.simulate("fedavg", out=None, byzantine=2, **star).rows[-1]["test_acc"]
    clipped = p2pfl.simulate("fedavg", out=None, byzantine=2, robust_aggregation="centered-clipping", **star)
    assert attacked < clean - 0.2 and clipped.rows[-1]["test_acc"] > clean - 0.1


def test_centered_clipping_at_the_server_clips_around_the_servers_model():
    """The star's neighbourhood: the server's model weighs nothing and is no candidate."""
    h = hood([0.0, 0.0], [(0.5, [3.0, 4.0]), (0.5, [0.6, 0.8])], radius=1.0, own_weight=0.0)
    assert torch.allclose(RULES["centered-clipping"].function(h), torch.tensor([0.6, 0.8]))
    assert torch.equal(RULES["median"].function(h), torch.tensor([1.8, 2.4]))  # the two uploads only


def test_a_users_attack_and_rule_by_reference_are_checked_where_they_enter(tmp_path, monkeypatch):
    (tmp_path / "mine.py").write_text(
        "def echo(view):\n    return view.own\n\n"
        "def keep(hood):\n    return hood.own.clone()\n\n"
        "def short(hood):\n    return hood.own[:1]\n\n"
        "def two(a, b):\n    return a\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("mine", None)
    settings = dict(dataset="synthetic", peers=8, rounds=2, progress=False)
    echo = p2pfl.simulate("dpsgd", out=None, byzantine=2, attack="mine:echo", **settings).rows
    clean = p2pfl.simulate("dpsgd", out=None, **settings).rows
    assert echo[-1]["train_loss"] != clean[-1]["train_loss"]  # the same dynamics, measured over 6 peers, not 8
    kept = p2pfl.simulate("dpsgd", out=None, robust_aggregation="mine:keep", **settings).rows
    assert kept[-1]["consensus_distance"] > clean[-1]["consensus_distance"]  # no averaging at all
    with pytest.raises(UserError, match=r"--robust-aggregation mine:short returned \(1,\); it must return"):
        p2pfl.simulate("dpsgd", out=None, robust_aggregation="mine:short", **settings)
    with pytest.raises(UserError, match=r"--attack mine:two: two\(a, b\) cannot be called as two\(view\)"):
        p2pfl.simulate("dpsgd", out=None, byzantine=1, attack="mine:two", **settings)


@pytest.mark.parametrize(
    "settings, message",
    [
        (
            dict(algo="choco", byzantine=2),
            "act on the averaging of dfedavg, dfedavgm, dpsgd, muffliato, fedavg, fedprox, moon; --algo choco",
        ),
        (dict(algo="scaffold", robust_aggregation="median"), "--algo scaffold does not take them"),
        (
            dict(algo="fedavg", robust_aggregation="clipped-gossip"),
            "is a rule for the graph; on the star choose one of: centered",
        ),
        (dict(algo="dpsgd", robust_aggregation="centered-clipping"), "is a rule for the star; on the graph choose"),
        (dict(algo="dpsgd", attack="ipm"), "--attack needs Byzantine peers"),
        (dict(algo="dpsgd", byzantine=2, attack="nope"), "unknown attack 'nope'; choose one of: sign-flip"),
        (dict(algo="dpsgd", robust_aggregation="mean"), "unknown robust aggregation 'mean'"),
        (dict(algo="dpsgd", byzantine=8), "makes 8 of the 8 peers Byzantine"),
        (dict(algo="dpsgd", byzantine=2.5), "a count of peers is a whole number"),
        (dict(algo="dpsgd", byzantine=1, static=True, gossip_topk=0.1), "a codec sends changes to public copies"),
        (dict(algo="dpsgd", robust_bound=1.5), "--robust-bound must be a whole number of peers or auto"),
    ],
)
def test_threats_refused_in_one_line(settings, message):
    algo = settings.pop("algo")
    with pytest.raises(UserError, match=message):
        p2pfl.simulate(algo, out=None, dataset="synthetic", peers=8, rounds=1, progress=False, **settings)


def test_label_flip_poisons_the_attackers_copies_only():
    ctx, _ = make_context(byzantine=2, attack="label-flip", algo="dpsgd")
    honest = [p for p in range(8) if p not in ctx.threats.attackers]
    clean, _ = make_context(algo="dpsgd")
    for p in sorted(ctx.threats.attackers):  # their shards point at copies appended to the training set
        assert int(ctx.shards[p].min()) >= len(clean.data.train_y)
    for p in honest:
        assert torch.equal(ctx.data.train_y[ctx.shards[p]], clean.data.train_y[clean.shards[p]])
    for p in sorted(ctx.threats.attackers):
        assert torch.equal(ctx.data.train_y[ctx.shards[p]], 9 - clean.data.train_y[clean.shards[p]])


def test_dp_epsilon_is_the_accountant_librarys_for_the_runs_clip_noise_sampling_and_steps():
    """D-PSGD: one DP-SGD step a round on a minibatch of 10 from each peer's shard, so q = 10 / shard and
    steps = rounds; DFedAvg: every step of its local epochs. Computed here with dp_accounting directly."""
    from dp_accounting import dp_event, rdp

    def expected(q, steps):
        accountant = rdp.RdpAccountant()
        accountant.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(1.5)), steps)
        return accountant.get_epsilon(1e-4)

    settings = dict(dataset="synthetic", peers=6, progress=False, dp_clip=1.0, dp_noise=1.5, dp_delta=1e-4)
    ctx, _ = make_context(algo="dpsgd", peers=6)
    sizes = [len(s) for s in ctx.shards]
    run = p2pfl.simulate("dpsgd", out=None, rounds=7, **settings)
    spent = run.final.get("dp_epsilon_per_peer") or [run.final["dp_epsilon"]] * 6
    assert spent == pytest.approx([expected(10 / n, 7) for n in sizes], rel=1e-5)
    assert run.rows[-1]["dp_epsilon"] == pytest.approx(max(spent)) and run.final["dp_delta"] == 1e-4
    local = p2pfl.simulate("dfedavg", out=None, rounds=2, local_epochs=2, batch_size=50, **settings)
    steps = [2 * 2 * math.ceil(n / 50) for n in sizes]
    assert local.rows[-1]["dp_epsilon"] == pytest.approx(
        max(expected(50 / n, s) for n, s in zip(sizes, steps)), rel=1e-5
    )


RING = dict(dataset="synthetic", peers=6, topology="ring", static=True, mixing="uniform", progress=False)
PRIVATE = dict(dp_clip=1.0, dp_noise=1.5, dp_delta=1e-4)


def ring_mixing(n: int) -> np.ndarray:
    """The ring's uniform W: a third on each peer and its two neighbours."""
    w = np.zeros((n, n))
    for i in range(n):
        w[i, [(i - 1) % n, i, (i + 1) % n]] = 1 / 3
    return w


def test_exposure_sums_the_shares_of_a_peers_noise_in_what_another_hears():
    """Muffliato's averaging bound on the ring of 4, by hand: in one gossip step a neighbour hears u's noised value
    itself (1) and the peer across nothing; a second step adds each neighbour's average, a third of whose
    noise is u's where u is in it (4/3 for a neighbour, who hears u's third from one side, 2/3 across)."""
    from p2pfl.threats.privacy import exposure

    heard = [[3, 1], [0, 2], [1, 3], [2, 0]]
    assert exposure(ring_mixing(4), 1, heard).tolist() == [[0, 1, 0, 1], [1, 0, 1, 0], [0, 1, 0, 1], [1, 0, 1, 0]]
    two = exposure(ring_mixing(4), 2, heard)
    assert two[0, 1] == pytest.approx(4 / 3) and two[0, 3] == pytest.approx(4 / 3) and two[0, 2] == pytest.approx(2 / 3)


def test_network_epsilon_is_the_accountants_for_each_pair_over_the_gossip_steps():
    """dp_epsilon_network, from dp_accounting directly: each pair's exposure computed here in loops over the
    steps and the hearer's neighbours, each of u's steps a Gaussian of noise 1.5 / sqrt(S) sampled at
    10 / shard. Exposures are rounded up to 4 digits in p2pfl: never below, within 1%."""
    from dp_accounting import dp_event, rdp

    def expected(q, noise, steps):
        accountant = rdp.RdpAccountant()
        accountant.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(noise)), steps)
        return accountant.get_epsilon(1e-4)

    def share(power, w, u):
        return power[w, u] ** 2 / float((power[w] ** 2).sum())

    ctx, _ = make_context(algo="dpsgd", peers=6)
    q = [10 / len(s) for s in ctx.shards]
    w, rounds = ring_mixing(6), 4
    one_step = p2pfl.simulate("dpsgd", out=None, rounds=rounds, **RING, **PRIVATE)
    assert "dp_epsilon_network" not in one_step.final  # later rounds carry most of a noise: not counted
    for steps in (2, 3):
        run = p2pfl.simulate("dpsgd", out=None, rounds=rounds, gossip_steps=steps, **RING, **PRIVATE)
        means = []
        for u in range(6):
            spent = []
            for v in range(6):
                exposure = sum(
                    share(np.linalg.matrix_power(w, t), hearer, u)
                    for t in range(steps)
                    for hearer in ((v - 1) % 6, (v + 1) % 6)
                )
                spent.append(expected(q[u], 1.5 / math.sqrt(exposure), rounds) if v != u and exposure else 0.0)
            means.append(sum(spent) / 5)
        got = run.final["dp_epsilon_network"]
        assert sum(means) / 6 * (1 - 1e-5) <= got <= sum(means) / 6 * 1.01  # 6 digits in final.json
        assert run.rows[-1]["dp_epsilon_network"] == pytest.approx(got, rel=1e-5)
        assert run.rows[-1]["bytes_sent"] == steps * one_step.rows[-1]["bytes_sent"]  # a message each step


def test_muffliato_gossips_its_noised_step_where_dpsgd_keeps_its_last_one():
    """Muffliato-SGD steps, then averages K times: each model holds its noise averaged, so the peers sit
    closer than under D-PSGD with the same K, which averages and then steps. K defaults to ceil(ln n / gap)."""
    settings = dict(rounds=3, dp_clip=1.0, dp_noise=4.0, **RING)
    muffliato = p2pfl.simulate("muffliato", out=None, gossip_steps=4, **settings)
    dpsgd = p2pfl.simulate("dpsgd", out=None, gossip_steps=4, **settings)
    assert muffliato.rows[-1]["consensus_distance"] < dpsgd.rows[-1]["consensus_distance"] / 2
    assert muffliato.final["dp_epsilon_network"] == pytest.approx(dpsgd.final["dp_epsilon_network"])
    auto = p2pfl.simulate("muffliato", out=None, **settings)  # the ring of 6: gap 1/3, ceil(ln 6 * 3) = 6 steps
    assert auto.rows[-1]["bytes_sent"] == 6 * p2pfl.simulate("dpsgd", out=None, **settings).rows[-1]["bytes_sent"]
    lossy = p2pfl.simulate("muffliato", out=None, drop_links=0.2, **settings)  # not the averaging the count models
    assert "dp_epsilon_network" not in lossy.final and "dp_epsilon" in lossy.final
    with pytest.raises(UserError, match="--algo muffliato adds noise to each step: give --dp-clip"):
        p2pfl.simulate("muffliato", out=None, **RING)


@pytest.mark.mpi
def test_muffliato_is_the_same_on_three_ranks_and_resumes_equal(tmp_path):
    from p2pfl import testing

    args = ["--algo", "dpsgd", "--dataset", "synthetic", "--peers", "8", "--rounds", "2", "--static"]
    args += ["--gossip-steps", "3", "--dp-clip", "1", "--dp-noise", "1", "--no-progress"]
    testing.check_layout_invariance(args, tmp_path / "layout")
    testing.check_resume(args, tmp_path / "resume")


def test_private_gradients_clip_each_samples_gradient_before_the_noise():
    """Without noise and with a clip no sample reaches, DP-SGD's gradient is the minibatch mean; with a small
    clip every sample's share is at most clip / batch."""
    from p2pfl.local.gradients import PrivateStep, gradients, private_gradients

    ctx, _ = make_context(algo="dpsgd")
    index, mask = ctx.minibatch(0, 10)
    x, y = ctx.data.train_x[index], ctx.data.train_y[index]
    plain, losses = gradients(ctx.stack, ctx.flat, x, y, mask)
    keys = [(0, "dp-noise", 0, p) for p in ctx.peers]
    loose, private_losses = private_gradients(ctx.stack, ctx.flat, x, y, mask, PrivateStep(1e9, 0.0, 10, keys))
    assert torch.allclose(loose, plain, atol=1e-6) and torch.allclose(private_losses, losses)
    tight, _ = private_gradients(ctx.stack, ctx.flat, x, y, mask, PrivateStep(1e-3, 0.0, 10, keys))
    assert bool((tight.norm(dim=1) <= 1e-3 * 1.0001).all())
    noised, _ = private_gradients(ctx.stack, ctx.flat, x, y, mask, PrivateStep(1e-3, 2.0, 10, keys))
    assert float((noised - tight).std()) == pytest.approx(2.0 * 1e-3 / 10, rel=0.05)  # noise of 2 C, over the batch


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(algo="dpsgd", dp_clip=1.0), "needs both --dp-clip C"),
        (dict(algo="dpsgd", dp_noise=1.0), "needs both --dp-clip C"),
        (dict(algo="ntk-dfl", dp_clip=1.0, dp_noise=1.0), "--algo ntk-dfl does not"),
        (dict(algo="dpsgd", dp_delta=1e-3), "--dp-delta states the privacy of a DP-SGD run"),
        (dict(algo="dpsgd", dp_clip=1.0, dp_noise=1.0, dp_delta=1.0), "--dp-delta must be in \\(0, 1\\)"),
        (dict(algo="dpsgd", gossip_steps=2, static=True, gossip_topk=0.1), "a codec's copies move once a round"),
    ],
)
def test_impossible_privacy_settings_are_one_line(settings, message):
    algo = settings.pop("algo")
    with pytest.raises(UserError, match=message):
        p2pfl.simulate(algo, out=None, dataset="synthetic", peers=8, rounds=1, progress=False, **settings)


@pytest.mark.skipif(
    not Path("/usr/share/datasets/fashion-mnist").exists(),
    reason="Fashion-MNIST (dataset-fashion-mnist) is not installed",
)
def test_dp_sgd_refuses_a_model_whose_batch_couples_or_noises_its_samples():
    with pytest.raises(UserError, match="--model cnn-fmnist's batch norm or dropout"):
        p2pfl.simulate(
            "dpsgd",
            out=None,
            dataset="fashion-mnist",
            model="cnn-fmnist",
            peers=4,
            kappa=2,
            samples_per_peer=20,
            rounds=1,
            progress=False,
            dp_clip=1.0,
            dp_noise=1.0,
        )
