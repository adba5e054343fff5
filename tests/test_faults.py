"""Simulated faults: offline peers, lost messages and stragglers, the same on any number of ranks."""

import json

import numpy as np
import pytest
import torch

from p2pfl.comm.faults import Faults
from p2pfl.run import main
from tests.conftest import ranked_cases, write_stripes
from tests.helpers import make_context, metric_lines


def rows_on_one_and_more_ranks(tmp_path, ranked_run):
    """The run's metrics rows, checked equal (every field but timings and memory, final.json and model.pt)
    on 1 and the case's ranks."""
    return metric_lines(ranked_run.same_as_one_process(tmp_path))


def test_fault_draws_have_their_rates_and_depend_only_on_their_keys():
    faults = Faults(seed=3, peers=50, drop_peers=0.2, drop_links=0.1, slow_peers=0.3, slow_factor=4, deadline=2)
    offline = np.mean([faults.offline(k, p) for k in range(100) for p in range(50)])
    lost = np.mean(
        [
            not faults.delivered(k, p, q, "x")
            for k in range(20)
            for p in range(50)
            for q in range(50)
            if not faults.offline(k, p) and not faults.offline(k, q)
        ]
    )
    assert abs(offline - 0.2) < 0.02
    assert abs(lost - (1 - 0.9 * 0.7)) < 0.02  # lost, or late from a straggler (4 > deadline 2)
    again = Faults(seed=3, peers=50, drop_peers=0.2, drop_links=0.1, slow_peers=0.3)
    assert [again.offline(7, p) for p in range(50)] == [faults.offline(7, p) for p in range(50)]
    assert not any(faults.offline(k, 50) for k in range(100))  # a star's server never goes offline
    in_time = Faults(seed=3, peers=50, slow_peers=0.9, slow_factor=1.5, deadline=2)
    assert all(in_time.delivered(0, p, 1, "x") for p in range(50))  # slow but within the deadline


def test_an_offline_peer_keeps_its_weights_and_the_others_average_what_arrived():
    ctx, algo = make_context(algo="dfedavg", drop_peers=0.3, drop_links=0.2, local_epochs=1, seed=2)
    before = ctx.flat.clone()
    losses = algo.round(0).losses
    offline = [p for p in ctx.peers if ctx.faults.offline(0, p)]
    assert offline and len(offline) < len(ctx.peers)
    for p in offline:
        assert torch.equal(ctx.flat[p], before[p]) and torch.isnan(losses[p])
    assert all(not torch.equal(ctx.flat[p], before[p]) for p in ctx.peers if p not in offline)


def test_no_faults_changes_nothing(tmp_path):
    """--drop-peers 0 is the fault-free run, bit for bit (the transport sees no fault model)."""
    args = [
        "--dataset",
        "synthetic",
        "--peers",
        "8",
        "--kappa",
        "3",
        "--rounds",
        "2",
        "--local-epochs",
        "1",
        "--no-progress",
    ]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "--drop-peers", "0", "--drop-links", "0", "--out", str(tmp_path / "b")]) == 0
    assert metric_lines(tmp_path / "a") == metric_lines(tmp_path / "b")


FAULTY = {
    "dfedavg": (3, ["--kappa", "3", "--slow-peers", "0.2"]),
    "ntk-dfl": (3, ["--kappa", "3", "--ntk-taus", "50,100", "--lr", "0.1"]),
    "fedavg": (2, ["--clients-per-round", "6", "--slow-peers", "0.2"]),
    "dpsgd": (4, ["--kappa", "3", "--rounds", "12"]),
    "moon": (3, ["--clients-per-round", "0"]),
    "ntk-fl": (2, ["--clients-per-round", "8", "--ntk-taus", "50,100", "--lr", "0.1"]),
    "cyclic": (3, ["--cyclic-rounds", "2", "--then", "scaffold", "--clients-per-round", "0"]),
    "central": (2, ["--clients-per-round", "0", "--slow-peers", "0.2"]),
    "dispfl": (3, ["--kappa", "3", "--lr", "0.05"]),
    "datashare": (2, ["--clients-per-round", "0"]),
}


def _faulty(algo: str) -> list[str]:
    return [
        "--dataset",
        "synthetic",
        "--peers",
        "12",
        "--rounds",
        "5",
        "--local-epochs",
        "2",
        "--no-progress",
        "--algo",
        algo,
        "--drop-peers",
        "0.2",
        "--drop-links",
        "0.1",
        "--seed",
        "4",
        *FAULTY[algo][1],
    ]


@pytest.mark.layouts  # tiny synthetic runs in the shared mpirun: make test-fast keeps them
@ranked_cases({algo: (ranks, _faulty(algo)) for algo, (ranks, _) in FAULTY.items()})
@pytest.mark.parametrize("algo", sorted(FAULTY))
def test_faulty_runs_learn_and_equal_across_rank_counts(tmp_path, algo, ranked_run):
    rows = rows_on_one_and_more_ranks(tmp_path, ranked_run)
    assert rows[-1]["test_acc"] > max(0.3, rows[0]["test_acc"])  # it learns (10 classes: chance is 0.1)
    assert sum(len(r["offline"]) for r in rows) > 0 and sum(r["messages_lost"] for r in rows) > 0
    assert all(1.0 <= r["sim_time"] <= 2.0 for r in rows)
    if "--slow-peers" in FAULTY[algo][1]:
        assert sum(len(r["stragglers"]) for r in rows) > 0
    config = (tmp_path / "one" / "config.toml").read_text()
    assert "drop_peers = 0.2" in config and "drop_links = 0.1" in config


@ranked_cases(
    {
        "": (
            3,
            [
                "--algo",
                "fedavg-ft",
                "--dataset",
                "linear-rep",
                "--peers",
                "12",
                "--rounds",
                "60",
                "--ft-trials",
                "2",
                "--drop-peers",
                "0.2",
                "--drop-links",
                "0.1",
                "--no-progress",
            ],
        )
    }
)
def test_fedavg_ft_under_faults_learns_and_equals_across_rank_counts(tmp_path, ranked_run):
    rows = rows_on_one_and_more_ranks(tmp_path, ranked_run)
    assert rows[-1]["rep_dist"] < rows[0]["rep_dist"] and rows[-1]["test_loss"] < 0.95 * rows[0]["test_loss"]


def _tct_on_stripes(data):
    return [
        "--algo",
        "tct",
        "--dataset",
        "mnist",
        "--data-dir",
        write_stripes(data, 4, 120, 40),
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
        "3",
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
        "--seed",
        "3",
        "--drop-peers",
        "0.1",
        "--drop-links",
        "0.2",
    ]


@ranked_cases({"": (3, _tct_on_stripes)})
def test_tct_under_faults_learns_and_equals_across_rank_counts(tmp_path, ranked_run):
    """Stage 1 and stage 2 average what arrived; the one-time convexification is exchanged reliably."""
    rows = rows_on_one_and_more_ranks(tmp_path, ranked_run)
    assert [r["stage"] for r in rows] == [1, 1, 2, 2, 2]
    assert rows[-1]["test_acc"] > 0.5 and sum(r["messages_lost"] for r in rows) > 0


def test_fault_flags_are_checked(capsys):
    assert main(["--dataset", "synthetic", "--drop-peers", "1", "--no-progress"]) == 2
    assert "--drop-peers is a probability in [0, 1)" in capsys.readouterr().err
    assert main(["--dataset", "synthetic", "--slow-peers", "0.1", "--slow-factor", "0.5", "--no-progress"]) == 2
    assert "--slow-factor must be at least 1" in capsys.readouterr().err


@pytest.mark.subprocess
def test_resume_under_faults_equals_the_uninterrupted_run(tmp_path):
    """Faults are keyed by round, so a resumed faulty run draws the same ones."""
    from tests.test_resume import BASE, SLOW, _interrupt_and_resume

    _interrupt_and_resume(
        tmp_path, [*BASE, *SLOW, "--algo", "dfedavg", "--kappa", "3", "--drop-peers", "0.2", "--drop-links", "0.1"]
    )
    rows = [json.loads(line) for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert all("offline" in r for r in rows)
