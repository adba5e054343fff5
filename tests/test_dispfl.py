"""DisPFL: ERK densities, masks that keep their counts, the mask-wise neighbour average, sparse messages
at about half of the dense bytes, the personalized test sets, and mpirun -n 3 against one process."""

import json
import math

import numpy as np
import pytest
import torch

from p2pfl.algorithms.graph.dispfl import erk_densities
from p2pfl.measure.scoring import personal_test_sets
from p2pfl.gossip.bitpack import pack_mask, unpack_mask
from tests.conftest import ranked_cases, run_here, write_stripes
from tests.helpers import make_context

DECENTRAL = {"dataset": "synthetic", "peers": 8, "kappa": 3, "local_epochs": 1, "algo": "dispfl"}


@pytest.fixture(scope="module")
def stripes(tmp_path_factory):
    return write_stripes(tmp_path_factory.mktemp("stripes"), 10, 600, 200)


def test_erk_keeps_the_target_total_and_makes_small_layers_dense():
    shapes = [(100, 784), (100,), (10, 100), (10,)]
    d = erk_densities(shapes, 0.5)
    sizes = [math.prod(s) for s in shapes]
    assert sum(x * n for x, n in zip(d, sizes)) == pytest.approx(0.5 * sum(sizes))
    assert d[1] == d[2] == d[3] == 1.0 and 0 < d[0] < 0.5
    even = erk_densities([(50, 50), (50, 50)], 0.3)
    assert even == pytest.approx([0.3, 0.3])


def test_masks_pack_to_bits():
    mask = torch.rand(1001) < 0.4
    packed = pack_mask(mask)
    assert packed.numel() == 126 and torch.equal(unpack_mask(packed, 1001), mask)


def test_masks_keep_every_layers_count_and_weights_stay_on_them():
    ctx, alg = make_context(**DECENTRAL, rounds=4)
    counts = [int(d * s.numel) for s, d in zip(alg.slots, alg.densities)]
    first = alg.mask.clone()
    for k in range(3):
        alg.round(k)
        for slot, n in zip(alg.slots, counts):
            assert (alg.mask[:, slot.offset : slot.offset + slot.numel].sum(1) == n).all()
        outside = ctx.flat[:, : alg.width][~alg.trained_mask]
        assert (outside == 0).all()  # training never leaves the mask it trained with
    assert sum(counts) / alg.width == pytest.approx(0.5, abs=1e-3)
    assert not torch.equal(first, alg.mask)  # the masks moved (prune and regrow)


def test_aggregation_averages_each_coordinate_over_the_masks_that_keep_it():
    ctx, alg = make_context(**DECENTRAL, dispfl_different_masks=True)
    ctx.flat[:, : alg.width] = torch.randn_like(ctx.flat[:, : alg.width]) * alg.trained_mask
    out = alg.aggregate(0)
    graph = ctx.schedule.graph(0)
    for p in (0, 5):
        group = [p, *graph.neighbors(p)]
        masks = alg.trained_mask[group].float()
        total = (ctx.flat[group, : alg.width] * masks).sum(0)
        count = masks.sum(0)
        expected = torch.where(count > 0, total / count.clamp(min=1), torch.zeros_like(total))
        assert torch.allclose(out[p, : alg.width], expected, atol=1e-6)


def test_personal_test_sets_follow_each_peers_label_mix():
    ctx, _ = make_context(**DECENTRAL, partition="classes", classes_per_peer=2)
    labels = [ctx.samples(p)[1] for p in ctx.peers]
    sets = personal_test_sets(ctx.data.test_y, ctx.data.n_classes, labels, ctx.peers, 8, ctx.cfg.seed)
    size = math.ceil(len(ctx.data.test_y) / 8)
    for p, index in enumerate(sets):
        assert len(index) == size
        train = set(np.unique(ctx.data.train_y[ctx.shards[p]].numpy()).tolist())
        assert set(np.unique(ctx.data.test_y[index].numpy()).tolist()) <= train


def test_dispfl_messages_weigh_about_half_of_dfedavgs(stripes, tmp_path):
    common = [
        "--peers",
        "8",
        "--kappa",
        "3",
        "--rounds",
        "2",
        "--local-epochs",
        "1",
        "--dataset",
        "mnist",
        "--data-dir",
        str(stripes),
        "--partition",
        "classes",
        "--samples-per-peer",
        "30",
        "--test-samples",
        "100",
        "--no-progress",
    ]
    rows = {}
    for algo in ("dispfl", "dfedavg"):
        result = run_here("--algo", algo, *common, "--out", str(tmp_path / algo))
        assert result.returncode == 0, result.stderr[-2000:]
        rows[algo] = [json.loads(line) for line in (tmp_path / algo / "metrics.jsonl").read_text().splitlines()]
    for sparse, dense in zip(rows["dispfl"], rows["dfedavg"]):
        assert sparse["bytes_dense"] == dense["bytes_sent"]
        assert 0.5 < sparse["bytes_sent"] / dense["bytes_sent"] < 0.56  # half the weights + 1 bit a weight
        assert "client_personal_acc_mean" in sparse and "client_personal_acc_mean" in dense


@ranked_cases(
    {
        "": (
            3,
            lambda data: [
                "--algo",
                "dispfl",
                "--peers",
                "7",
                "--kappa",
                "2",
                "--rounds",
                "3",
                "--local-epochs",
                "1",
                "--dataset",
                "mnist",
                "--data-dir",
                write_stripes(data, 10, 600, 200),
                "--partition",
                "classes",
                "--samples-per-peer",
                "30",
                "--test-samples",
                "100",
                "--no-progress",
            ],
        )
    }
)
def test_dispfl_under_mpi_equals_one_process(tmp_path, ranked_run):
    """Its masks and personal models too: every metric, final.json and model.pt equal."""
    ranked_run.same_as_one_process(tmp_path)


def test_mask_positions_are_what_boolean_indexing_finds():
    """DisPFL's messages take their values by these positions (no host sync on a GPU): the same entries in
    the same order as indexing by the mask, for masks of one count each."""
    from p2pfl.algorithms.graph.dispfl import mask_positions

    gen = torch.Generator().manual_seed(0)
    mask = torch.zeros(6, 500, dtype=torch.bool)
    for row in mask:
        row[torch.randperm(500, generator=gen)[:77]] = True
    x = torch.randn(6, 500, generator=gen)
    positions = mask_positions(mask, 77)
    assert all(torch.equal(x[r][mask[r]], x[r, positions[r]]) for r in range(6))
