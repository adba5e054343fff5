"""Each client model is scored on its own seeded, class-stratified subset of the test set, drawn from
(seed, peer); the aggregated model on all of it; each row says how far the clients' mean may be from
the whole set's, and that statement holds against the spread over repeated draws."""

import numpy as np
import pytest
import torch

import p2pfl
from p2pfl.measure.scoring import PeerScores, client_subset_size, client_test_subset, subset_variance
from p2pfl.local.forward import evaluate
from p2pfl.testing import MACHINE_FACTS
from tests.helpers import make_context

TINY = dict(dataset="synthetic", peers=6, kappa=2, rounds=3, local_epochs=1, progress=False)


def test_each_peers_subset_is_seeded_stratified_its_own_and_whole_where_asked():
    strata = np.repeat(np.arange(4), [500, 300, 150, 50])
    pick = client_test_subset(strata, 200, seed=3, peer=0)
    assert len(pick) == 200 and len(set(pick.tolist())) == 200 and (np.diff(pick) > 0).all()
    assert np.bincount(strata[pick]).tolist() == [100, 60, 30, 10]  # each class its share
    assert (pick == client_test_subset(strata, 200, seed=3, peer=0)).all()
    assert not (pick == client_test_subset(strata, 200, seed=3, peer=1)).all()  # another peer, another draw
    assert not (pick == client_test_subset(strata, 200, seed=4, peer=0)).all()
    assert client_subset_size(None, 300, 10_000) == 205 and client_subset_size(None, 100, 10_000) == 589
    assert client_subset_size(None, 3, 10_000) == 6_757 and client_subset_size(None, 1, 10_000) == 8_621
    assert client_subset_size(0, 300, 10_000) == 10_000
    assert client_subset_size(50, 300, 10_000) == 50 and client_subset_size(50_000, 3, 10_000) == 10_000


def test_the_stated_error_of_the_peers_mean_is_the_spread_over_repeated_draws():
    """Fixed per-sample scores of 50 peers (right or wrong, by class and by peer); the peers' mean over
    their own subsets, drawn again with 300 seeds, spreads around the whole set's mean as stated."""
    rng = np.random.default_rng(0)
    peers, strata = 50, np.repeat(np.arange(10), 700)
    skill = rng.uniform(0.3, 0.95, (peers, 10))[:, strata]  # each peer's accuracy by class
    values = (rng.uniform(size=skill.shape) < skill).astype(float)
    population = {h: 700 for h in range(10)}
    size = client_subset_size(None, peers, len(strata))
    assert size == 1061
    means, stated = [], []
    for seed in range(300):
        picks = np.stack([client_test_subset(strata, size, seed, p) for p in range(peers)])
        own = np.take_along_axis(values, picks, 1)
        means.append(own.mean(1).mean())
        stated.append(np.sqrt(subset_variance(own, strata[picks], population).sum()) / peers)
    spread = np.std(np.array(means) - values.mean())
    assert abs(np.mean(stated) / spread - 1) < 0.12, (np.mean(stated), spread)
    assert np.max(stated) <= 0.002  # the default size holds the error to 0.2 points


def test_a_run_scores_each_client_on_its_own_subset_and_the_server_on_every_sample():
    run = p2pfl.simulate("dfedavg", **TINY, client_test_samples=150, out=None)
    whole = p2pfl.simulate("dfedavg", **TINY, client_test_samples=0, out=None)
    for row in run.rows:
        assert 0 < row["client_acc_se"] < 0.1 and "client_acc_min" not in row and "client_acc_max" not in row
        assert "client_personal_acc_min" in row  # a peer's personal set is its metric's definition, not a sample
    assert not any("client_acc_se" in r for r in whole.rows) and all("client_acc_min" in r for r in whole.rows)
    for key in ("test_acc", "variance", "consensus_distance"):
        assert [r[key] for r in run.rows] == [r[key] for r in whole.rows]
    assert [r["client_acc_mean"] for r in run.rows] != [r["client_acc_mean"] for r in whole.rows]
    assert all(
        abs(a["client_acc_mean"] - b["client_acc_mean"]) < 5 * a["client_acc_se"] + 1e-9
        for a, b in zip(run.rows, whole.rows)
    )


def test_the_scores_are_each_peers_model_on_its_own_samples():
    ctx, algorithm = make_context(**{k: v for k, v in TINY.items() if k != "progress"})
    algorithm.round(0)
    test = (ctx.data.test_x, ctx.data.test_y)
    scores = PeerScores(ctx.stack, test, len(test[1]), (ctx.peers, 6), 120, seed=7)
    got, variances = scores.local_scores(ctx.flat)
    for i, p in enumerate(ctx.peers):
        pick = torch.from_numpy(scores.index[i].numpy())
        alone = evaluate(ctx.stack, ctx.flat[i : i + 1], test[0][pick], test[1][pick])
        assert got["acc"][i].item() == pytest.approx(alone["acc"][0].item(), abs=1e-6)
        assert got["loss"][i].item() == pytest.approx(alone["loss"][0].item(), rel=1e-5)
    assert (variances > 0).all()


def test_every_row_carries_its_training_evaluation_and_total_time():
    rows = p2pfl.simulate("fedavg", **{**TINY, "topology": "star", "clients_per_round": 3}, eval_every=2).rows
    assert "test_acc" not in rows[0] and "test_acc" in rows[1]  # a row that does not evaluate has the times too
    for row in rows:
        assert {"train_s", "eval_s", "round_s"} <= set(MACHINE_FACTS) & set(row)
        assert (
            0 < row["train_s"] and 0 < row["eval_s"] and row["train_s"] + row["eval_s"] <= row["round_s"] + 2e-4
        )  # each rounded to 0.1 ms


@pytest.mark.parametrize("size", [150, 0])
def test_only_peers_whose_weights_changed_are_scored_again_and_the_scores_equal_a_fresh_evaluation(monkeypatch, size):
    from p2pfl.measure import scoring as evaluation

    ctx, algorithm = make_context(
        algo="fedavg", dataset="synthetic", peers=8, topology="star", clients_per_round=2, local_epochs=1
    )
    test = (ctx.data.test_x, ctx.data.test_y)
    scores = PeerScores(ctx.stack, test, len(test[1]), (ctx.peers, 8), size, seed=0)
    evaluated = []
    for name in ("evaluate", "evaluate_own"):
        real = getattr(evaluation, name)
        monkeypatch.setattr(
            evaluation,
            name,
            lambda stack, flat, *a, real=real, **k: evaluated.append(len(flat)) or real(stack, flat, *a, **k),
        )
    for k in range(3):
        algorithm.round(k)
        kept, _ = scores.local_scores(ctx.flat)
    assert evaluated[0] == 8 and all(n <= 2 for n in evaluated[1:]), evaluated  # 2 clients trained a round
    fresh, _ = PeerScores(ctx.stack, test, len(test[1]), (ctx.peers, 8), size, seed=0).local_scores(ctx.flat)
    assert all(torch.equal(kept[m], fresh[m]) for m in fresh)
    ctx.flat[3, 0] = torch.nextafter(ctx.flat[3, 0], torch.tensor(float("inf")))  # one bit of one peer
    evaluated.clear()
    scores.local_scores(ctx.flat)
    assert evaluated == [1]  # that peer alone
