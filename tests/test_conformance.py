"""Every registered algorithm, by being registered, gets the conformance checks (p2pfl.testing): it runs
and learns in 2 rounds, one process equals 3 MPI ranks (links dropping), a run stopped after round 1 and resumed equals
the uninterrupted run, and it finishes with dropped links. With CUDA present, `pytest -m cuda` also
compares each algorithm's run on the GPU with its run on the CPU."""

import pytest

from p2pfl import testing
from p2pfl.algorithms import REGISTRY
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
}
ALGOS = sorted(REGISTRY)


def tiny(algo: str) -> list[str]:
    """2 rounds (TCT's stages: 1 + 1 in FITS)."""
    return [*TINY, "--rounds", "2", "--algo", algo, *FITS.get(algo, [])]


@pytest.mark.parametrize("algo", ALGOS)
def test_runs_and_learns(tmp_path, algo):
    testing.check_learns(tiny(algo), tmp_path)


@ranked_cases({algo: (3, [*tiny(algo), "--drop-links", "0.2"]) for algo in ALGOS})
@pytest.mark.parametrize("algo", ALGOS)
def test_one_process_equals_three_ranks_with_dropped_links(tmp_path, algo, ranked_run):
    """testing.check_layout_invariance, with every algorithm's 3-rank run made by one shared mpirun; with
    links dropping, so that lost messages are the same on any layout too."""
    ranked_run.same_as_one_process(tmp_path)
    assert sum(row.get("messages_lost", 0) for row in testing.results(ranked_run.out)["metrics"]) > 0


@pytest.mark.parametrize("algo", ALGOS)
def test_stopped_after_round_one_and_resumed_equals_uninterrupted(tmp_path, algo):
    testing.check_resume(tiny(algo), tmp_path)


@pytest.mark.parametrize("algo", ALGOS)
def test_finishes_with_dropped_links(tmp_path, algo):
    testing.check_faults(tiny(algo), tmp_path)


@pytest.mark.cuda
@needs_check_device
@pytest.mark.parametrize("algo", ALGOS)
def test_cuda_agrees_with_cpu(tmp_path, algo):
    testing.check_device_agrees(tiny(algo), tmp_path, CHECK_DEVICE)
