"""The GPU against the CPU, round by round, on the paths the MLP conformance runs (tests/test_conformance.py
-m cuda) do not take: a conv net with dropout, a batch-norm net on unequal shards, FedProx's idle peers and
terms, and NTK-DFL's batched evolution at a full neighbourhood (1,200 samples). Both devices draw the same
minibatches and dropout masks (keyed hashes in integer arithmetic), so they differ only by rounding:
after every round the weights within WEIGHT_TOLERANCE (relative 2-norm), the test accuracy within
ACCURACY_POINTS points and the loss within LOSS_TOLERANCE (relative), and every peer chooses the same
NTK t. Marked cuda: `pytest -m cuda` on a GPU machine (bash bench/gpu_check.sh runs them); skipped
elsewhere, except in the check's rehearsal (P2PFL_CHECK_DEVICE=cpu, tests/helpers.py). The checks
themselves are tested on the CPU (tests/test_gpu_check.py): each fails on the difference it is for."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from p2pfl.runner.configure import make_config, resolve
from p2pfl.runner.assemble import build
from p2pfl.local.forward import evaluate
from p2pfl.seeding import keyed_bits, keyed_orders, keyed_uniform, peer_keys
from p2pfl.testing import chosen_taus
from tests.conftest import write_stripes
from tests.helpers import CHECK_DEVICE, needs_check_device

WEIGHT_TOLERANCE = 1e-3
ACCURACY_POINTS = 1.0
LOSS_TOLERANCE = 0.02
FMNIST = Path("/usr/share/datasets/fashion-mnist")

pytestmark = [pytest.mark.cuda, needs_check_device]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    """Fashion-MNIST where it is installed, else a generated MNIST-format set of its size."""
    if FMNIST.exists():
        return {"dataset": "fashion-mnist"}
    return {"dataset": "mnist", "data_dir": str(write_stripes(tmp_path_factory.mktemp("stripes"), 10, 12000, 2000))}


def rounds_on(device: str, values: dict, rounds: int):
    """After each round: (every peer's weights on the CPU, the test metrics of peer 0's and the mean
    model, the t chosen as the round reports it: each peer's for NTK-DFL, [] where none is chosen)."""
    cfg = resolve(make_config({**values, "device": device, "progress": False}), 1)
    ctx, algorithm = build(cfg, 0, 1, 0)
    x, y = ctx.data.test_x[:2000], ctx.data.test_y[:2000]
    for k in range(rounds):
        result = algorithm.round(k)
        model = ctx.global_weights if ctx.global_weights is not None else ctx.flat.mean(0)
        scores = evaluate(ctx.stack, torch.stack([ctx.flat[0], model]), x, y)
        yield ctx.flat.cpu().clone(), {m: v.cpu() for m, v in scores.items()}, chosen_taus(result)


def assert_round_follows(k: int, cpu: tuple, gpu: tuple, chooses_t: bool = False) -> None:
    """Round k's (weights, scores, chosen t) on the device against the CPU's; chooses_t: the algorithm
    chooses a t every round, so an empty list is a broken reading, not agreement."""
    (w_cpu, s_cpu, t_cpu), (w_gpu, s_gpu, t_gpu) = cpu, gpu
    assert torch.isfinite(w_gpu).all(), f"round {k + 1}: non-finite weights on the GPU"
    off = float((w_gpu - w_cpu).norm() / w_cpu.norm())
    assert off <= WEIGHT_TOLERANCE, f"round {k + 1}: the GPU's weights are {off:.1e} off the CPU's"
    assert float((s_gpu["acc"] - s_cpu["acc"]).abs().max()) * 100 <= ACCURACY_POINTS, (k + 1, s_cpu, s_gpu)
    loss_off = float(((s_gpu["loss"] - s_cpu["loss"]).abs() / s_cpu["loss"].abs().clamp(min=1.0)).max())
    assert math.isfinite(loss_off) and loss_off <= LOSS_TOLERANCE, (k + 1, s_cpu, s_gpu)
    assert not chooses_t or (t_cpu and t_gpu), f"round {k + 1}: no chosen t read (CPU {t_cpu}, GPU {t_gpu})"
    assert t_gpu == t_cpu, f"round {k + 1}: chosen t {t_gpu} on the GPU, {t_cpu} on the CPU"


def assert_gpu_follows_cpu(values: dict, rounds: int) -> None:
    chooses_t = values["algo"] in ("ntk-dfl", "ntk-fl", "cp-ntk-fl")
    for k, (cpu, gpu) in enumerate(zip(rounds_on("cpu", values, rounds), rounds_on(CHECK_DEVICE, values, rounds))):
        assert_round_follows(k, cpu, gpu, chooses_t)


def test_keyed_draws_are_the_same_bits_on_the_device():
    """The keyed hashes behind every minibatch order and dropout mask: bit for bit the CPU's on the device
    (int32 arithmetic, wrapping multiplies), first, since every comparison below rests on them."""
    keys = peer_keys(11, "shuffle", 4, list(range(300)))
    on = peer_keys(11, "shuffle", 4, list(range(300)), CHECK_DEVICE)
    counters = torch.arange(5000, dtype=torch.int32)
    assert torch.equal(
        keyed_bits(keys[:, None], 7, counters[None]), keyed_bits(on[:, None], 7, counters.to(on.device)[None]).cpu()
    )
    assert torch.equal(keyed_uniform(keys, 5000, 2, 9), keyed_uniform(on, 5000, 2, 9).cpu())
    lengths = torch.randint(0, 900, (300,), generator=torch.Generator().manual_seed(0))
    assert torch.equal(keyed_orders(keys, lengths, 900, 3), keyed_orders(on, lengths.to(on.device), 900, 3).cpu())


def test_a_dropout_conv_net_on_the_gpu_follows_the_cpu(data):
    assert_gpu_follows_cpu(
        {
            **data,
            "algo": "dfedavg",
            "model": "cnn-fmnist",
            "peers": 6,
            "kappa": 2,
            "samples_per_peer": 100,
            "local_epochs": 1,
            "lr": 0.01,
        },
        rounds=3,
    )


def test_a_batch_norm_net_on_unequal_shards_on_the_gpu_follows_the_cpu(data):
    assert_gpu_follows_cpu(
        {
            **data,
            "algo": "dfedavg",
            "model": "resnet8",
            "peers": 6,
            "kappa": 2,
            "samples_per_peer": 60,
            "alpha": 0.1,
            "local_epochs": 1,
            "lr": 0.01,
        },
        rounds=2,
    )


def test_fedprox_with_idle_clients_on_the_gpu_follows_the_cpu(data):
    assert_gpu_follows_cpu(
        {
            **data,
            "algo": "fedprox",
            "model": "simple-cnn",
            "peers": 8,
            "samples_per_peer": 80,
            "alpha": 0.1,
            "local_epochs": 2,
            "lr": 0.01,
        },
        rounds=2,
    )


def test_dfedavgm_mlp_with_momentum_on_the_gpu_follows_the_cpu(data):
    assert_gpu_follows_cpu(
        {**data, "algo": "dfedavgm", "peers": 30, "kappa": 3, "samples_per_peer": 150, "alpha": 0.1, "local_epochs": 3},
        rounds=3,
    )


def test_ntk_dfl_batched_evolution_at_a_full_neighbourhood_follows_the_cpu_loop(data):
    """12 peers of 200 samples on a 5-regular graph: neighbourhoods of 1,200 samples, as at paper scale;
    the GPU evolves them as one batch, the CPU one by one in the compiled loop."""
    assert_gpu_follows_cpu(
        {**data, "algo": "ntk-dfl", "peers": 12, "kappa": 5, "samples_per_peer": 200, "alpha": 0.1}, rounds=2
    )
