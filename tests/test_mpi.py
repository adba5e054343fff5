"""Real multi-process runs: mpirun with several ranks must give the single-process numbers. Every
algorithm on 3 ranks: tests/test_conformance.py; here, other rank counts, uneven layouts and seeds."""

import os
import subprocess
import sys

import pytest

from p2pfl import testing
from tests.conftest import ROOT, mpirun, ranked_cases, run_cli
from tests.helpers import metric_lines

COMMON = ["--dataset", "synthetic", "--peers", "12", "--kappa", "3", "--rounds", "3", "--no-progress"]


def test_mpirun_is_installed():
    assert mpirun() is not None, "make install puts mpirun (Open MPI wheel) into the virtualenv"


@pytest.mark.mpi
def test_mpi_bad_input_exits_2_with_one_line():
    result = run_cli("--peers", "7", "--kappa", "3", ranks=2)
    assert result.returncode == 2
    assert result.stderr.count("p2pfl: error:") == 1


@pytest.mark.mpi
def test_the_out_check_is_rank_0s_on_every_rank(tmp_path):
    """A rank behind the others may find rank 0's new run folder already written; alone it refused the
    folder and the others waited until --comm-timeout. Here ranks 1 and 2 see files, rank 0 does not."""
    for rank in (1, 2):
        (tmp_path / f"r{rank}").mkdir()
        (tmp_path / f"r{rank}" / "config.toml").write_text("")
    result = subprocess.run(
        testing.mpirun_command(3, sys.executable, "tests/mpi_out_check_script.py", str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-1500:]
    assert sorted(result.stdout.split("\n"))[-3:] == ["rank 0 ok", "rank 1 ok", "rank 2 ok"]


@pytest.mark.mpi
def test_mpi_timeout_names_missing_peer():
    result = subprocess.run(
        testing.mpirun_command(2, sys.executable, "tests/mpi_timeout_script.py"),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert "TIMEOUT" in result.stdout, result.stdout + result.stderr
    assert "peers [1] on ranks [1]" in result.stdout and "round 4, average" in result.stdout


LAYOUTS = {  # algorithm: (peers, seed, ranks, what else)
    "fedavg": (13, 5, 4, ["--clients-per-round", "7"]),
    "moon": (9, 1, 2, ["--clients-per-round", "0"]),
    "dispfl": (10, 9, 3, ["--kappa", "3"]),
    "dfedavgm": (15, 9, 4, ["--kappa", "4", "--mixing", "metropolis", "--topology", "erdos-renyi"]),
    "fednova": (11, 2, 3, ["--clients-per-round", "0", "--momentum", "0.5"]),
    "cyclic": (10, 4, 3, ["--cyclic-rounds", "1", "--then", "scaffold"]),
    "dpsgd": (7, 8, 2, ["--topology", "ring", "--aggregate", "sample-weighted", "--partition", "iid"]),
}


def _layout(algo: str) -> list[str]:
    peers, seed, _, extra = LAYOUTS[algo]
    return [
        "--dataset",
        "synthetic",
        "--peers",
        str(peers),
        "--seed",
        str(seed),
        "--rounds",
        "2",
        "--local-epochs",
        "1",
        "--samples-per-peer",
        "60",
        "--algo",
        algo,
        "--no-progress",
        *extra,
    ]


@ranked_cases({algo: (LAYOUTS[algo][2], _layout(algo)) for algo in LAYOUTS})
@pytest.mark.parametrize("algo", sorted(LAYOUTS))
def test_every_metric_is_the_same_on_any_layout(tmp_path, algo, ranked_run):
    """Peer counts that do not divide evenly over the ranks, other seeds, topologies and algorithms:
    every metrics.jsonl field but timings and memory, final.json and model.pt equal one process's."""
    ranked_run.same_as_one_process(tmp_path)
    assert ranked_run.ranks == LAYOUTS[algo][2] and len(metric_lines(ranked_run.out)) == 2


@pytest.mark.subprocess
def test_numpys_blas_runs_on_one_thread_even_when_numpy_was_imported_first():
    """Its results depend on its thread count; a script (or a test process) that imports numpy or torch
    before p2pfl would otherwise get other numbers than the CLI."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    code = (
        "import numpy, p2pfl; from threadpoolctl import threadpool_info; "
        "print(sorted({p['num_threads'] for p in threadpool_info() if p['user_api'] == 'blas'}))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert result.returncode == 0 and result.stdout.strip() == "[1]", result.stdout + result.stderr


def _graph_function_run(function: str) -> list[str]:
    return [
        "--dataset",
        "synthetic",
        "--peers",
        "6",
        "--rounds",
        "3",
        "--topology",
        f"tests.graph_functions:{function}",
        "--mixing",
        "metropolis",
        "--no-progress",
    ]


RANK_DEPENDENT = ("rank_local_edge", "unseeded")


@ranked_cases({f: (3, _graph_function_run(f)) for f in RANK_DEPENDENT})
@pytest.mark.parametrize("function", RANK_DEPENDENT)
def test_a_graph_function_that_differs_between_ranks_stops_in_one_line(function, ranked_run):
    """A difference inside rank 0's own peers ran on with wrong numbers; an unseeded one waited for
    messages never sent until --comm-timeout. Both stop before round 1's exchanges, naming the function."""
    stderr = ranked_run.result.stderr
    assert ranked_run.result.returncode == 2, stderr[-1500:]
    assert stderr.count("p2pfl: error:") == 1
    assert f"--topology tests.graph_functions:{function} gave rank" in stderr
    said = "other than rank 0's in round 1: " if function == "rank_local_edge" else "other than rank 0's in round "
    assert said in stderr and ": each rank calls it" in stderr  # unseeded: round 1 unless the ranks drew alike
    assert not (ranked_run.out / "metrics.jsonl").exists() or not (ranked_run.out / "metrics.jsonl").read_text()
