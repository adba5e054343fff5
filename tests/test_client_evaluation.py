"""Client models are scored on a fixed, seeded, class-stratified subset of the test set; the aggregated
model on all of it; each row says how far the subset's client mean may be from the whole set's."""

import numpy as np
import pytest
import torch

import p2pfl
from p2pfl.evaluation import client_test_subset, subset_mean_error
from p2pfl.testing import MACHINE_FACTS
from p2pfl.forward import evaluate
from tests.helpers import make_context

TINY = dict(dataset="synthetic", peers=6, kappa=2, rounds=3, local_epochs=1, progress=False)


def test_the_subset_is_seeded_stratified_and_whole_where_asked():
    labels = torch.tensor(np.repeat(np.arange(4), [500, 300, 150, 50]))
    pick = client_test_subset(labels, 200, seed=3, stratify=True)
    assert len(pick) == 200 and len(set(pick.tolist())) == 200 and torch.equal(pick, pick.sort().values)
    assert np.bincount(labels[pick].numpy()).tolist() == [100, 60, 30, 10]  # each class its share
    assert torch.equal(pick, client_test_subset(labels, 200, seed=3, stratify=True))
    assert not torch.equal(pick, client_test_subset(labels, 200, seed=4, stratify=True))
    assert client_test_subset(labels, 0, 3, True) is None and client_test_subset(labels, 1000, 3, True) is None
    assert len(client_test_subset(labels, 7, 3, stratify=False)) == 7


def test_the_stated_error_is_the_spread_of_subset_means_over_draws():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(10), 1000)
    # per-sample scores as a run's: the clients' mean accuracy on each sample, by class and by difficulty
    values = np.clip(rng.uniform(0.1, 0.9, 10)[labels] + rng.normal(0, 0.15, len(labels)), 0, 1)
    population = {h: 1000 for h in range(10)}
    size = 2000
    means, stated = [], []
    for seed in range(400):
        pick = client_test_subset(torch.from_numpy(labels), size, seed, stratify=True).numpy()
        means.append(values[pick].mean())
        stated.append(subset_mean_error(values[pick], labels[pick], population))
    spread = np.std(np.array(means) - values.mean())
    assert abs(np.mean(stated) / spread - 1) < 0.12
    plain = np.std(
        [values[np.random.default_rng(s).choice(len(values), size, replace=False)].mean() for s in range(400)]
    )
    assert spread < plain / 2  # stratifying removes the classes' differences from the error


def test_a_run_scores_clients_on_the_subset_and_the_server_on_every_sample():
    ctx, algorithm = make_context(**{k: v for k, v in TINY.items() if k != "progress"}, client_test_samples=150)
    from p2pfl.algorithms.base import Round
    from p2pfl.loop import reported_model
    from p2pfl.metrics import MetricsLog

    log = MetricsLog(ctx, None, False, lambda weights: reported_model(ctx, weights, algorithm))
    assert len(log.peers.client_x) == 150 and len(log.peers.test_x) == len(ctx.data.test_y) > 150
    algorithm.round(0)
    row = log.record(0, Round(), 0.0, 0.0, True)
    mine = evaluate(ctx.stack, ctx.flat, log.peers.client_x, log.peers.client_y)["acc"]
    assert row["client_acc_mean"] == pytest.approx(float(mine.double().mean()), abs=1e-9)
    assert 0 < row["client_acc_se"] < 0.1


def test_the_subset_changes_the_client_scores_and_nothing_else():
    part = p2pfl.simulate("dfedavg", **TINY, client_test_samples=120)
    whole = p2pfl.simulate("dfedavg", **TINY, client_test_samples=0)
    assert all("client_acc_se" in r for r in part.rows) and not any("client_acc_se" in r for r in whole.rows)
    assert [r["test_acc"] for r in part.rows] == [r["test_acc"] for r in whole.rows]
    assert [r["variance"] for r in part.rows] == [r["variance"] for r in whole.rows]
    assert [r["client_acc_mean"] for r in part.rows] != [r["client_acc_mean"] for r in whole.rows]


def test_every_row_carries_its_training_evaluation_and_total_time():
    rows = p2pfl.simulate("fedavg", **{**TINY, "topology": "star", "clients_per_round": 3}, eval_every=2).rows
    assert "test_acc" not in rows[0] and "test_acc" in rows[1]  # a row that does not evaluate has the times too
    for row in rows:
        assert {"train_s", "eval_s", "round_s"} <= set(MACHINE_FACTS) & set(row)
        assert (
            0 < row["train_s"] and 0 < row["eval_s"] and row["train_s"] + row["eval_s"] <= row["round_s"] + 2e-4
        )  # each rounded to 0.1 ms


def test_only_peers_whose_weights_changed_are_scored_again_and_the_scores_equal_a_fresh_evaluation(monkeypatch):
    from p2pfl import evaluation
    from p2pfl.loop import reported_model
    from p2pfl.metrics import MetricsLog

    ctx, algorithm = make_context(
        algo="fedavg",
        dataset="synthetic",
        peers=8,
        topology="star",
        clients_per_round=2,
        local_epochs=1,
        client_test_samples=150,
    )
    log = MetricsLog(ctx, None, True, lambda weights: reported_model(ctx, weights, algorithm))
    evaluated = []
    real = evaluation.evaluate
    monkeypatch.setattr(
        evaluation, "evaluate", lambda stack, flat, *a, **k: evaluated.append(len(flat)) or real(stack, flat, *a, **k)
    )
    for k in range(3):
        log.record(k, algorithm.round(k), 0.0, 0.0, True)
    assert evaluated[0] == 8 and all(n <= 2 for n in evaluated[1:]), evaluated  # 2 clients trained a round
    fresh, by_sample = real(ctx.stack, ctx.flat, log.peers.client_x, log.peers.client_y, by_sample=True)
    scores, sample_sum = log.peers.local_scores()
    assert all(torch.equal(scores[m], fresh[m]) for m in fresh)
    assert torch.equal(sample_sum, by_sample["acc"].double().sum(0))
    ctx.flat[3, 0] = torch.nextafter(ctx.flat[3, 0], torch.tensor(float("inf")))  # one bit of one peer
    evaluated.clear()
    log.peers.local_scores()
    assert evaluated == [1]  # that peer alone (its personal test set is scored in the same batched way)
