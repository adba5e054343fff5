"""MOON (the contrastive term, mu = 0 is FedAvg) and CyclicFL (phase 1 is a sequential relay, phase 2
the chosen algorithm from its model), in-process, from the CLI, and under mpirun -n 3."""

import json
import math

import pytest
import torch

from p2pfl.runner.configure import make_config
from p2pfl.errors import UserError
from p2pfl.seeding import numpy_rng
from p2pfl.local.gradients import Contrast
from p2pfl.local.training import train_epochs
from tests.conftest import ranked_cases, run_here, write_stripes
from tests.helpers import make_context, metric_lines

STAR = {"dataset": "synthetic", "peers": 6, "clients_per_round": 3, "local_epochs": 1}


@pytest.fixture(scope="module")
def stripes(tmp_path_factory):
    return write_stripes(tmp_path_factory.mktemp("stripes"), 10, 600, 200)


def test_contrastive_loss_is_log2_when_the_anchors_agree_and_ranks_the_features():
    ctx, _ = make_context(**STAR, algo="moon")
    w = ctx.flat[:2].clone()
    other = w + 0.3 * torch.randn_like(w)
    x = ctx.data.train_x[:16].expand(2, 16, -1)
    mask = torch.ones(2, 16)
    features = ctx.stack.forward(w, x, features=True)[1]
    same = Contrast(w, w, mu=0.7, temperature=0.5).losses(ctx.stack, features, x, mask)
    assert torch.allclose(same, torch.full((2,), 0.7 * math.log(2)), atol=1e-6)
    near_positive = Contrast(w, other, 1.0, 0.5).losses(ctx.stack, features, x, mask)
    near_negative = Contrast(other, w, 1.0, 0.5).losses(ctx.stack, features, x, mask)
    assert (near_positive < math.log(2)).all() and (near_negative > math.log(2)).all()


def moon_fedavg_args(data_dir, model):
    return [
        "--peers",
        "6",
        "--clients-per-round",
        "3",
        "--rounds",
        "2",
        "--local-epochs",
        "1",
        "--lr",
        "0.05",
        "--batch-size",
        "32",
        "--momentum",
        "0",
        "--dataset",
        "mnist",
        "--data-dir",
        str(data_dir),
        "--model",
        model,
        "--test-samples",
        "100",
        "--no-progress",
    ]


@pytest.mark.parametrize("model", ["mlp", "cnn-fmnist"])
def test_moon_with_mu_zero_is_fedavg(stripes, tmp_path, model):
    """The contrastive term is computed and weighted by 0: every number equals FedAvg's (the conv net
    also covers dropout and the one-peer-at-a-time path). The MLP runs --no-batch: batched, FedAvg's
    MLP takes hand-written products that round differently from the autograd path MOON needs."""
    args = moon_fedavg_args(stripes, model) + (["--no-batch"] if model == "mlp" else [])
    runs = {}
    for name, extra in {"fedavg": [], "moon0": ["--moon-mu", "0"], "moon": ["--moon-mu", "1"]}.items():
        algo = "fedavg" if name == "fedavg" else "moon"
        result = run_here("--algo", algo, *args, *extra, "--out", str(tmp_path / name))
        assert result.returncode == 0, result.stderr[-2000:]
        runs[name] = torch.load(tmp_path / name / "model.pt", weights_only=True)
    assert metric_lines(tmp_path / "fedavg") == metric_lines(tmp_path / "moon0")
    assert all(torch.equal(runs["fedavg"][k], runs["moon0"][k]) for k in runs["fedavg"])
    assert any(not torch.equal(runs["fedavg"][k], runs["moon"][k]) for k in runs["fedavg"])


def test_cyclic_phase_one_is_a_sequential_relay_without_averaging():
    ctx, alg = make_context(**STAR, algo="cyclic", rounds=3, cyclic_rounds=2, cyclic_steps=4, batch_size=16)
    start = ctx.global_weights.clone()
    alg.round(0)
    order = numpy_rng(ctx.cfg.seed, "cyclic", 0).choice(6, alg.visits(), replace=False)
    assert alg.visits() == 1  # floor(0.25 * 6)
    expected = start[None].clone()
    opt = ctx.sgd(steps=4)
    for client in order.tolist():
        train_epochs(
            ctx.stack,
            expected,
            [ctx.shards[client]],
            [client],
            ctx.data.train_x,
            ctx.data.train_y,
            opt,
            ctx.cfg.lr,
            ctx.cfg.seed,
            0,
        )
    assert torch.equal(ctx.global_weights, expected[0])
    assert torch.equal(ctx.flat[order[-1]], expected[0])


def test_cyclic_visits_a_quarter_of_the_clients_in_a_random_order_each_round():
    ctx, alg = make_context(**{**STAR, "peers": 12}, algo="cyclic", rounds=3, cyclic_rounds=2, cyclic_steps=1)
    orders = [numpy_rng(ctx.cfg.seed, "cyclic", k).choice(12, alg.visits(), replace=False).tolist() for k in range(2)]
    assert alg.visits() == 3 and orders[0] != orders[1]
    assert any(o != sorted(o) for o in orders)  # the sampled order, not client-id order


def test_cyclic_rounds_count_towards_the_total_and_default_to_the_papers():
    cfg = make_config({"algo": "cyclic", "peers": 20, "cyclic_rounds": 30})
    assert cfg.rounds == 930
    with pytest.raises(UserError, match="--cyclic-rounds"):
        make_config({"algo": "cyclic", "peers": 20, "rounds": 5, "cyclic_rounds": 5})


@pytest.mark.parametrize("then", ["fedavg", "moon", "scaffold", "fedprox"])
def test_cyclic_then_runs_from_the_cli(stripes, tmp_path, then):
    out = tmp_path / then
    result = run_here(
        "--algo",
        "cyclic",
        "--then",
        then,
        "--peers",
        "8",
        "--clients-per-round",
        "2",
        "--rounds",
        "3",
        "--cyclic-rounds",
        "2",
        "--cyclic-steps",
        "3",
        "--local-epochs",
        "1",
        "--dataset",
        "mnist",
        "--data-dir",
        str(stripes),
        "--test-samples",
        "100",
        "--out",
        str(out),
        "--no-progress",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in rows] == ["cyclic", "cyclic", then]
    model_bytes = 79510 * 4
    for r in rows[:2]:  # two visits (floor(8/4)), each down and up
        assert r["bytes_by_phase"] == {"cyclic-down": 2 * model_bytes, "cyclic-up": 2 * model_bytes}
    factor = 2 if then == "scaffold" else 1
    assert rows[2]["bytes_by_phase"] == {"download": 2 * factor * model_bytes, "upload": 2 * factor * model_bytes}
    assert (out / "accuracy.png").exists()


UNDER_MPI = {
    "cyclic": ["--algo", "cyclic", "--then", "moon", "--rounds", "4", "--cyclic-rounds", "2", "--cyclic-steps", "3"],
    "moon": ["--algo", "moon", "--rounds", "2"],
}


@ranked_cases(
    {
        name: (
            3,
            lambda data, args=args: [
                *args,
                "--peers",
                "7",
                "--clients-per-round",
                "3",
                "--local-epochs",
                "1",
                "--dataset",
                "mnist",
                "--data-dir",
                write_stripes(data, 10, 600, 200),
                "--model",
                "cnn-fmnist",
                "--test-samples",
                "100",
                "--no-progress",
            ],
        )
        for name, args in UNDER_MPI.items()
    }
)
@pytest.mark.parametrize("name", sorted(UNDER_MPI))
def test_cyclic_moon_and_moon_under_mpi_equal_one_process(tmp_path, name, ranked_run):
    ranked_run.same_as_one_process(tmp_path)
