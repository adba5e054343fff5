"""The optimizers of decentralized learning (gradient tracking, D², SGP, QG-DSGDm, DSGDm) and what their
studies measure: the convex check of docs/optimizers.md at a smaller size, D²'s condition, push-sum's
de-biased mean on a directed graph, and grad_norm against an independent autograd computation."""

import sys
from pathlib import Path

import pytest
import torch

import p2pfl
from p2pfl import testing
from p2pfl.errors import UserError
from tests.helpers import make_context

# The convex check (docs/optimizers.md) on 8 peers and 1,000 rounds instead of 16 and 2,000.
CONVEX = dict(
    dataset="synthetic",
    model="logistic",
    peers=8,
    topology="ring",
    static=True,
    partition="classes",
    classes_per_peer=2,
    samples_per_peer=50,
    batch_size=50,
    weight_decay=1e-2,
    lr=1.0,
    grad_norm=True,
    progress=False,
    rounds=1000,
    eval_every=1000,
)


@pytest.mark.slow  # 1,000 rounds each (about 6 s)
@pytest.mark.parametrize("algo, extra", [("gt", {}), ("d2", {"d2_lazy": True})])
def test_gradient_tracking_and_d2_reach_the_optimum_where_dpsgd_stalls(algo, extra):
    assert p2pfl.simulate(algo, out=None, **CONVEX, **extra).rows[-1]["grad_norm"] < 1e-5


@pytest.mark.slow  # 1,000 rounds (about 6 s)
def test_dpsgd_stalls_at_a_floor_on_the_convex_check():
    assert p2pfl.simulate("dpsgd", out=None, **CONVEX).rows[-1]["grad_norm"] > 1e-2


def test_d2_with_no_lazy_refuses_a_w_with_eigenvalue_minus_a_third_and_names_the_fix():
    with pytest.raises(UserError, match="smallest eigenvalue is -0.3333.*drop --no-d2-lazy.*\\(I \\+ W\\)/2"):
        p2pfl.simulate("d2", out=None, **{**CONVEX, "rounds": 1, "d2_lazy": False})


def test_d2_mixes_lazily_where_w_fails_its_condition_and_the_header_says_so(tmp_path):
    """The default graph (10 peers, 5-regular) has a Metropolis W with eigenvalue -0.364: D² takes (I + W)/2
    there, as --d2-lazy does, and the run header says why; on a W that meets the condition it keeps W."""
    base = dict(dataset="synthetic", rounds=3, progress=False)
    auto = p2pfl.simulate("d2", out=tmp_path / "auto", **base)
    told = p2pfl.simulate("d2", out=None, d2_lazy=True, **base)
    assert [r["train_loss"] for r in auto.rows] == [r["train_loss"] for r in told.rows]
    assert "smallest eigenvalue is -0.3642" in (tmp_path / "auto" / "config.toml").read_text()
    complete = dict(base, peers=6, topology="full")  # W = 11^T/6: eigenvalues 0 and 1, the paper's W
    plain = p2pfl.simulate("d2", out=tmp_path / "plain", **complete)
    assert [r["train_loss"] for r in plain.rows] == [
        r["train_loss"] for r in p2pfl.simulate("d2", out=None, d2_lazy=False, **complete).rows
    ]
    assert [r["train_loss"] for r in plain.rows] != [
        r["train_loss"] for r in p2pfl.simulate("d2", out=None, d2_lazy=True, **complete).rows
    ]
    assert "eigenvalue" not in (tmp_path / "plain" / "config.toml").read_text()


@pytest.mark.skipif(
    not Path("/usr/share/datasets/fashion-mnist").exists(),
    reason="Fashion-MNIST (dataset-fashion-mnist) is not installed",
)
@pytest.mark.parametrize("algo", ["gt", "d2", "sgp", "qg-dsgdm"])
def test_the_optimizers_run_on_the_default_task(algo):
    """No setting but the algorithm: Fashion-MNIST, the MLP, 10 peers on a 5-regular graph."""
    result = p2pfl.simulate(algo, out=None, rounds=2, progress=False)
    assert result.config.dataset == "fashion-mnist" and result.rows[-1]["test_acc"] > 0.15


def test_optimizers_without_momentum_refuse_it():
    with pytest.raises(UserError, match="--algo gt steps without momentum"):
        p2pfl.simulate("gt", out=None, dataset="synthetic", peers=4, rounds=1, momentum=0.9, progress=False)


def test_sgp_debiases_to_the_mean_of_the_starting_models_on_a_digraph(tmp_path, monkeypatch):
    """The 4-peer digraph 0->1, 1->2, 2->3, 3->0, 0->2, 0->3, 1->3: in-degrees 1, 1, 2, 3, so uniform
    weights are not doubly stochastic there and averaging with them reaches a weighted mean."""
    (tmp_path / "digraphs.py").write_text(
        "import networkx as nx\n\ndef four(n, k, seed):\n"
        "    return nx.DiGraph([(0, 1), (1, 2), (2, 3), (3, 0), (0, 2), (0, 3), (1, 3)])\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    settings = dict(dataset="synthetic", peers=4, init="different", progress=False, eval_every=400)
    start = p2pfl.simulate("sgp", out=None, rounds=1, lr=1e-12, topology="digraphs:four", **settings)
    ctx, _ = make_context(algo="sgp", peers=4, init="different", topology="digraphs:four")
    mean = ctx.flat.double().mean(0)
    result = p2pfl.simulate("sgp", out=None, rounds=400, lr=1e-12, topology="digraphs:four", **settings)
    assert start.rows[0]["consensus_distance"] > 1e-3  # the peers start apart
    assert result.rows[-1]["consensus_distance"] < 1e-12
    reported = torch.cat([v.flatten() for v in result.model_state.values()]).double()
    assert torch.allclose(reported, mean, atol=1e-6), float((reported - mean).abs().max())
    del sys.modules["digraphs"]


def test_dsgdm_keeps_its_momentum_over_rounds_and_resumes_equal(tmp_path):
    args = ["--algo", "dpsgd", "--momentum", "0.9", "--dataset", "synthetic", "--peers", "6", "--rounds", "2"]
    testing.check_resume([*args, "--no-progress"], tmp_path)
    plain = p2pfl.simulate("dpsgd", out=None, dataset="synthetic", peers=6, rounds=3, progress=False)
    heavy = p2pfl.simulate("dpsgd", out=None, dataset="synthetic", peers=6, rounds=3, momentum=0.9, progress=False)
    assert plain.rows[-1]["train_loss"] != heavy.rows[-1]["train_loss"]


def test_grad_norm_is_the_objective_gradient_at_the_peers_mean_model():
    settings = dict(dataset="synthetic", model="logistic", peers=5, kappa=2, samples_per_peer=30, weight_decay=0.05)
    result = p2pfl.simulate("gt", out=None, rounds=2, grad_norm=True, progress=False, **settings)
    ctx, _ = make_context(**settings)
    weight, bias = (v.double().requires_grad_() for v in result.model_state.values())
    losses = []
    for shard in ctx.shards:
        x = ctx.data.train_x[shard].flatten(1).double()
        logits = x @ weight.T + bias
        losses.append(torch.nn.functional.cross_entropy(logits, ctx.data.train_y[shard]))
    objective = torch.stack(losses).mean() + 0.05 / 2 * (weight.square().sum() + bias.square().sum())
    objective.backward()
    expected = torch.cat([weight.grad.flatten(), bias.grad]).norm()
    assert result.rows[-1]["grad_norm"] == pytest.approx(float(expected), rel=1e-5)
