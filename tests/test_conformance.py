"""Every registered algorithm, by being registered, gets the conformance checks (p2pfl.testing): it runs
and learns in 2 rounds, one process equals 3 MPI ranks (links dropping), a run stopped after round 1 and resumed equals
the uninterrupted run, and it finishes with dropped links. With CUDA present, `pytest -m cuda` also
compares each algorithm's run on the GPU with its run on the CPU."""

import pytest

from p2pfl import testing
from p2pfl.algorithms import REGISTRY
from p2pfl.threats import ATTACKS, RULES
from tests.conftest import ranked_cases
from tests.helpers import CHECK_DEVICE, needs_check_device

TINY = [
    "--dataset",
    "synthetic",
    "--peers",
    "9",
    "--kappa",
    "2",
    "--local-epochs",
    "1",
    "--samples-per-peer",
    "60",
    "--seed",
    "3",
    "--no-progress",
]
# What an algorithm needs on top of TINY to be tiny too (short NTK evolutions, stage and phase lengths that
# fit 2 rounds). An algorithm not named here runs on TINY alone.
FITS = {
    "ntk-dfl": ["--ntk-taus", "50,100", "--lr", "0.1"],
    "ntk-fl": ["--ntk-taus", "50,100", "--lr", "0.1"],
    "cp-ntk-fl": ["--ntk-taus", "50,100", "--lr", "0.1", "--ntk-projection", "32"],
    "tct": ["--tct-stage1-rounds", "1", "--tct-stage2-rounds", "1", "--tct-features", "500", "--tct-local-steps", "20"],
    "cyclic": ["--cyclic-rounds", "1", "--then", "scaffold"],
    "fedavg-ft": ["--ft-trials", "1"],
    "choco": ["--static"],
    "d2": ["--static"],
    "muffliato": ["--dp-clip", "1", "--dp-noise", "0.3"],
}
ALGOS = sorted(REGISTRY)
# Each graph family and gossip codec beyond the defaults, on an algorithm that runs it.
GRAPHS = {
    "dfedavg-exponential": ["--algo", "dfedavg", "--topology", "exponential"],
    "dfedavg-one-peer-exponential": ["--algo", "dfedavg", "--topology", "one-peer-exponential"],
    "dfedavg-torus": ["--algo", "dfedavg", "--topology", "torus"],
    "dfedavg-hypercube": ["--algo", "dfedavg", "--topology", "hypercube", "--peers", "8"],
    "dfedavg-small-world": ["--algo", "dfedavg", "--topology", "small-world"],
    "dfedavg-topk": ["--algo", "dfedavg", "--static", "--gossip-topk", "0.05"],
    "dpsgd-randk": ["--algo", "dpsgd", "--static", "--gossip-randk", "0.1"],
    "dfedavgm-quant": ["--algo", "dfedavgm", "--static", "--gossip-quant-bits", "4"],
    "choco-quant": ["--algo", "choco", "--static", "--gossip-quant-bits", "4"],
    "choco-exponential": ["--algo", "choco", "--static", "--topology", "exponential"],
    "dpsgd-gossip-steps": ["--algo", "dpsgd", "--gossip-steps", "3"],
}
# Where one process and three ranks cut the peers into different blocks (training's blocks of 24 MLP peers:
# 24 + 6 on one process, 10 on each rank), so that a sum whose order follows the blocks shows up.
BLOCKS = {
    "dfedavg-30-peers": ["--algo", "dfedavg", "--peers", "30", "--kappa", "3", "--samples-per-peer", "30"],
    "ntk-dfl-30-peers": [
        "--algo",
        "ntk-dfl",
        "--peers",
        "30",
        "--kappa",
        "3",
        "--samples-per-peer",
        "30",
        *FITS["ntk-dfl"],
    ],
}
# Every attack, and every robust rule under the sign-flip attack, with 2 Byzantine peers of 9: on D-PSGD, and
# the star's rules on FedAvg; and DP-SGD in every algorithm that takes it.
THREATS = {
    **{f"dpsgd-attack-{name}": ["--algo", "dpsgd", "--byzantine", "2", "--attack", name] for name in ATTACKS},
    **{
        f"{algo}-robust-{name}": ["--algo", algo, "--byzantine", "2", "--robust-aggregation", name]
        for name, rule in RULES.items()
        for algo, family in (("dpsgd", "graph"), ("fedavg", "star"))
        if family in rule.applies
    },
    **{
        f"{algo}-dp-sgd": ["--algo", algo, "--dp-clip", "1", "--dp-noise", "1"]
        for algo in sorted(name for name, cls in REGISTRY.items() if cls.private_training)
    },
}
EXTRA = {**GRAPHS, **BLOCKS, **THREATS}  # cases beyond each algorithm's own, as full argument lists
CASES = {**{algo: [] for algo in ALGOS}, **EXTRA}
ONE_LAYOUT = {case: args for case, args in CASES.items() if case not in BLOCKS}  # what BLOCKS test is layouts


def tiny(case: str) -> list[str]:
    """2 rounds (TCT's stages: 1 + 1 in FITS) of an algorithm, or of a graph case."""
    if case in EXTRA:
        return [*TINY, "--rounds", "2", *EXTRA[case]]
    return [*TINY, "--rounds", "2", "--algo", case, *FITS.get(case, [])]


@pytest.mark.parametrize("algo", ALGOS)
def test_runs_and_learns(tmp_path, algo):
    testing.check_learns(tiny(algo), tmp_path)


@pytest.mark.layouts  # tiny synthetic runs in the shared mpirun: make test-fast keeps them
@ranked_cases({case: (3, [*tiny(case), "--drop-links", "0.2"]) for case in CASES})
@pytest.mark.parametrize("case", CASES)
def test_one_process_equals_three_ranks_with_dropped_links(tmp_path, case, ranked_run):
    """testing.check_layout_invariance, with every algorithm's 3-rank run made by one shared mpirun; with
    links dropping, so that lost messages are the same on any layout too."""
    ranked_run.same_as_one_process(tmp_path)
    assert sum(row.get("messages_lost", 0) for row in testing.results(ranked_run.out)["metrics"]) > 0


@pytest.mark.parametrize("case", ONE_LAYOUT)
def test_stopped_after_round_one_and_resumed_equals_uninterrupted(tmp_path, case):
    testing.check_resume(tiny(case), tmp_path)


@pytest.mark.parametrize("case", ONE_LAYOUT)
def test_finishes_with_dropped_links(tmp_path, case):
    testing.check_faults(tiny(case), tmp_path)


@pytest.mark.cuda
@needs_check_device
@pytest.mark.parametrize("case", CASES)
def test_cuda_agrees_with_cpu(tmp_path, case):
    testing.check_device_agrees(tiny(case), tmp_path, CHECK_DEVICE)
