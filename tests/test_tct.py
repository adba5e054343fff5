"""TCT: the eNTK features, the exact n-space form of the stage-2 local steps, SCAFFOLD on least squares,
and the whole algorithm from the CLI (one process and mpirun -n 3)."""

import json
from types import SimpleNamespace

import pytest
import torch

from p2pfl.algorithms.star.linear_stage import (
    StandardFeatures,
    centred_one_hot,
    client_round,
    local_steps_n_space,
    local_steps_p_space,
)
from p2pfl.models import build_model, initial_parameters
from p2pfl.ntk.convexified import entk_features, one_logit_network, subsample_index
from tests.conftest import ranked_cases, run_here, write_stripes

OPTIONS = SimpleNamespace(hidden=[16], norm="batch", rep_dim=5)


def features(n=30, p=50, seed=0):
    gen = torch.Generator().manual_seed(seed)
    raw = (torch.randn(n, p, generator=gen) * 3 + 1).half()
    z = raw.double()
    mean, sd = z.mean(0), z.std(0, unbiased=False)
    return StandardFeatures(raw, mean.float(), (1 / sd).float(), block=7), raw, mean, sd


def test_standard_features_products_equal_the_dense_matrix():
    Z, raw, mean, sd = features()
    dense = torch.cat([(raw.double() - mean) / sd, torch.ones(len(raw), 1, dtype=torch.float64)], 1)
    W = torch.randn(51, 4, dtype=torch.float64)
    A = torch.randn(30, 4, dtype=torch.float64)
    assert torch.allclose(Z.matmul(W.float()).double(), dense @ W, rtol=1e-4, atol=1e-4)
    assert torch.allclose(Z.t_matmul(A.float()).double(), dense.T @ A, rtol=1e-4, atol=1e-4)
    assert torch.allclose(Z.gram().double(), dense @ dense.T, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("n,p", [(30, 50), (40, 20)])
def test_n_space_local_steps_equal_the_p_space_loop(n, p):
    Z, *_ = features(n, p, seed=n)
    gen = torch.Generator().manual_seed(1)
    Y = centred_one_hot(torch.randint(0, 4, (n,), generator=gen), 4)
    theta = torch.randn(p + 1, 4, generator=gen) * 0.1
    h = torch.randn(p + 1, 4, generator=gen) * 0.01
    lr = 0.5 / float(torch.linalg.eigvalsh(Z.gram().double() / n)[-1])  # a stable step, as in TCT
    looped = local_steps_p_space(Z, Y, theta, h, lr, 60)
    fast = local_steps_n_space(Z, Z.gram(), Y, theta, h, lr, 60)
    assert torch.linalg.norm(fast - looped) / torch.linalg.norm(looped - theta) < 1e-4
    assert torch.linalg.norm(looped - theta) > 1e-3  # the steps did move the model


def test_scaffold_with_identical_clients_is_gradient_descent_on_the_union():
    Z, *_ = features(24, 40)
    Y = centred_one_hot(torch.arange(24) % 3, 3)
    lr, steps, rounds, clients = 2e-3, 5, 4, 3
    theta = torch.zeros(41, 3)
    h = [torch.zeros_like(theta)] * clients
    previous = [None] * clients
    for _ in range(rounds):
        local = []
        for k in range(clients):
            W, h[k] = client_round(Z, None, Y, theta, h[k], previous[k], lr, steps)
            previous[k] = W
            local.append(W)
        theta = sum(local) / clients
    gd = torch.zeros_like(theta)
    for _ in range(rounds * steps):  # the union of identical clients has the same mean gradient
        gd -= lr * Z.t_matmul(Z.matmul(gd) - Y) / len(Y)
    assert torch.allclose(theta, gd, rtol=1e-4, atol=1e-6)
    assert all(float(hk.abs().max()) < 1e-6 for hk in h)


def test_entk_features_equal_per_sample_backward_passes():
    model = build_model("simple-cnn", (1, 16, 16), 3, OPTIONS)
    flat = initial_parameters(model, [0], 0, "same", torch.device("cpu"))[0]
    net, layout, flat1 = one_logit_network("simple-cnn", (1, 16, 16), OPTIONS, flat, 3, seed=5)
    index = subsample_index(layout.trainable, 500, 123)
    x = torch.randn(6, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    got = entk_features(net, layout, flat1, x, index, memory_gb=0.0001)  # chunks of one sample

    reference = build_model("simple-cnn", (1, 16, 16), 1, OPTIONS)
    with torch.no_grad():
        for name, param in reference.named_parameters():
            param.copy_(layout.views(flat1)[name])
    reference.eval()
    for i in range(len(x)):
        reference.zero_grad()
        reference(x[i : i + 1])[0, 0].backward()
        row = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])[index]
        assert torch.allclose(got[i].float(), row.half().float(), rtol=1e-3, atol=1e-4)
    # the trunk is the trained network's and the head is one fresh logit, the same for every seed's caller
    assert torch.equal(one_logit_network("simple-cnn", (1, 16, 16), OPTIONS, flat, 3, seed=5)[2], flat1)
    assert net.head[-1].out_features == 1


def test_subsample_index_is_the_first_p_of_a_seeded_permutation():
    index = subsample_index(1000, 100, 123)
    assert torch.equal(index, torch.randperm(1000, generator=torch.Generator().manual_seed(123))[:100])
    assert torch.equal(subsample_index(50, 100, 123), torch.arange(50))


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    return write_stripes(tmp_path_factory.mktemp("digits"), 4, 120, 40)


TCT_ARGS = [
    "--algo",
    "tct",
    "--dataset",
    "mnist",
    "--model",
    "simple-cnn",
    "--peers",
    "4",
    "--partition",
    "classes",
    "--classes-style",
    "niid-bench",
    "--classes-per-peer",
    "1",
    "--tct-stage1-rounds",
    "2",
    "--tct-stage2-rounds",
    "2",
    "--tct-features",
    "2000",
    "--tct-local-steps",
    "20",
    "--tct-lr",
    "1e-5",
    "--local-epochs",
    "1",
    "--batch-size",
    "16",
    "--no-progress",
]


def test_tct_runs_both_stages_from_the_cli(digits, tmp_path):
    out = tmp_path / "run"
    result = run_here(*TCT_ARGS, "--data-dir", str(digits), "--out", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in rows] == [1, 1, 2, 2]
    assert "convexify" in rows[2]["bytes_by_phase"] and "normalize" in rows[2]["bytes_by_phase"]
    # stage 2 sends the (p + 1) x C linear model each way: 4 clients, 2001 x 10 float32
    assert rows[3]["bytes_by_phase"] == {"download": 4 * 2001 * 10 * 4, "upload": 4 * 2001 * 10 * 4}
    assert all(0 <= r["test_acc"] <= 1 for r in rows)
    assert rows[-1]["test_acc"] > 0.5  # the linear model on eNTK features separates the stripes
    linear = torch.load(out / "tct_linear.pt", weights_only=True)
    assert linear["weight"].shape == (10, 2000) and linear["bias"].shape == (10,)
    assert "2,000 of the convexified simple-cnn" in (out / "config.toml").read_text()
    assert (out / "accuracy.png").exists() and (out / "model.pt").exists()


def test_tct_refuses_rounds_that_disagree_with_its_stages(digits, tmp_path):
    result = run_here(*TCT_ARGS, "--rounds", "7", "--data-dir", str(digits), "--out", str(tmp_path / "x"))
    assert result.returncode == 2 and "--rounds 7 disagrees" in result.stderr


@ranked_cases({"": (3, lambda data: [*TCT_ARGS, "--data-dir", write_stripes(data, 4, 120, 40)])})
def test_tct_under_mpi_equals_one_process(tmp_path, ranked_run):
    one = ranked_run.same_as_one_process(tmp_path)
    one, three = (torch.load(run / "tct_linear.pt", weights_only=True) for run in (one, ranked_run.out))
    assert torch.equal(one["weight"], three["weight"]) and torch.equal(one["bias"], three["bias"])


def test_tct_lr_auto_is_half_the_stability_limit_of_the_stiffest_client(digits):
    """--tct-lr auto: each client's lambda_max of Z~^T Z~ / n_k by power iteration, one lr for all of
    AUTO_LR_SHARE * 2 / the largest; against the eigenvalues of the dense features."""
    from p2pfl.algorithms.star.tct import AUTO_LR_SHARE
    from p2pfl.runner.configure import parse_config, resolve
    from p2pfl.runner.assemble import build

    args = [a if a != "1e-5" else "auto" for a in TCT_ARGS] + ["--data-dir", str(digits), "--tct-solver", "p-space"]
    ctx, algorithm = build(resolve(parse_config(args), 1), 0, 1, 0)
    rounds = [algorithm.round(r) for r in range(3)]
    largest = 0.0
    for Z in algorithm.features.values():
        dense = torch.cat(
            [(Z.raw.double() - Z.mean.double()) * Z.inv_sd.double(), torch.ones(len(Z), 1, dtype=torch.float64)], 1
        )
        largest = max(largest, float(torch.linalg.eigvalsh(dense.T @ dense / len(Z))[-1]))
    assert algorithm.lr == pytest.approx(AUTO_LR_SHARE * 2 / largest, rel=0.02)
    assert rounds[2].fields == {"stage": 2, "tct_lr": algorithm.lr}


def test_tct_says_what_its_features_cost_and_refuses_what_cannot_fit(digits, tmp_path, monkeypatch):
    import p2pfl.algorithms.star.tct as tct

    result = run_here(*TCT_ARGS, "--data-dir", str(digits), "--out", str(tmp_path / "fits"), "--tct-stage2-rounds", "1")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "GiB (n x p x 2 bytes" in (tmp_path / "fits" / "config.toml").read_text()
    monkeypatch.setattr(tct, "machine_memory", lambda device: ("this machine", 2**30))
    result = run_here(*TCT_ARGS, "--data-dir", str(digits), "--out", str(tmp_path / "refused"))
    assert result.returncode == 2 and not (tmp_path / "refused" / "metrics.jsonl").exists()
    line = result.stderr.strip().splitlines()[-1]
    assert "eNTK features" in line and "--train-samples" in line and "1.0 GiB" in line


@pytest.mark.parametrize("value,ok", [("auto", True), ("3e-4", True), ("0", False), ("fast", False)])
def test_tct_lr_takes_a_positive_number_or_auto(value, ok):
    from p2pfl.runner.configure import parse_config

    if ok:
        assert parse_config(["--algo", "tct", "--tct-lr", value]).settings.tct_lr in (
            "auto",
            float(value) if value != "auto" else None,
        )
    else:
        with pytest.raises(Exception, match="--tct-lr"):
            parse_config(["--algo", "tct", "--tct-lr", value])


def test_feature_moments_are_summed_a_block_at_a_time():
    """convexify's feature sums without an n x p float64 copy of the features: blocks of rows give the
    sums the whole would (float64 sums of float16 features)."""
    from p2pfl.algorithms.star.linear_stage import Moments

    raw = torch.randn(37, 50, generator=torch.Generator().manual_seed(0)).half()
    whole = raw.double()
    for block_bytes in (1, 8 * 50 * 4, 2**28):
        m = Moments.of(raw, block_bytes)
        assert torch.allclose(m.total, whole.sum(0), rtol=0, atol=1e-12)
        assert torch.allclose(m.squares, (whole * whole).sum(0), rtol=0, atol=1e-12)
        assert m.count.item() == 37.0
