"""Per-round diagnostics: consensus distance, spectral gap, bytes per edge, NTK-DFL's chosen t."""

import json
import math

import networkx as nx
import numpy as np
import pytest
import torch

from p2pfl.measure.graph_diagnostics import edge_bytes, mixing_matrix, spectral_gap
from p2pfl.runner.round_row import squared_deviations, sum_rows
from p2pfl.measure.facts import consensus_distance
from tests.conftest import ranked_cases, run_here
from tests.helpers import metric_lines

DIAGNOSTICS = ("consensus_distance", "spectral_gap", "edge_bytes_min", "edge_bytes_mean", "edge_bytes_max")


def test_consensus_distance_is_the_mean_squared_distance_to_the_average():
    w = torch.tensor([[0.0, 0.0], [2.0, 0.0], [1.0, 3.0]])  # average (1, 1)

    def distance(w):
        return consensus_distance(float(squared_deviations(w, sum_rows(w) / len(w)).sum()), len(w))

    assert distance(w) == pytest.approx((2 + 2 + 4) / 3)
    assert distance(torch.ones(5, 7)) == 0.0


def test_spectral_gap_of_known_graphs():
    assert spectral_gap(mixing_matrix(nx.complete_graph(6), "uniform")) == pytest.approx(1.0)
    n = 10  # ring, uniform 1/3 weights: eigenvalues (1 + 2 cos(2 pi k / n)) / 3
    expected = 1 - max(abs(1 + 2 * math.cos(2 * math.pi * k / n)) / 3 for k in range(1, n))
    assert spectral_gap(mixing_matrix(nx.cycle_graph(n), "uniform")) == pytest.approx(expected, rel=1e-7)
    two_parts = nx.disjoint_union(nx.complete_graph(3), nx.complete_graph(3))
    assert spectral_gap(mixing_matrix(two_parts, "metropolis")) == pytest.approx(0.0, abs=1e-12)


def test_mixing_matrix_rows_sum_to_one():
    graph = nx.erdos_renyi_graph(12, 0.4, seed=1)
    for kind in ("uniform", "metropolis", "sample-weighted"):
        assert np.allclose(mixing_matrix(graph, kind, list(range(1, 13))).sum(1), 1.0)


def test_edge_bytes_counts_both_directions_and_silent_edges():
    graph = nx.path_graph(3)  # edges (0, 1), (1, 2)
    assert edge_bytes(graph, {(0, 1): 30, (5, 6): 99}) == {
        "edge_bytes_min": 0,
        "edge_bytes_mean": 15.0,
        "edge_bytes_max": 30,
    }


DIAGNOSED = {
    "ntk-dfl": ["--ntk-taus", "50,100,200", "--lr", "0.1", "--ntk-batches", "2"],
    "dispfl": ["--local-epochs", "1"],
    "dfedavg": ["--local-epochs", "1", "--drop-peers", "0.3", "--topology", "erdos-renyi", "--kappa", "4"],
}


@ranked_cases(
    {
        algo: (
            3,
            [
                "--dataset",
                "synthetic",
                "--peers",
                "10",
                "--kappa",
                "3",
                "--rounds",
                "3",
                "--eval-every",
                "2",
                "--seed",
                "4",
                "--samples-per-peer",
                "40",
                "--algo",
                algo,
                "--no-progress",
                *extra,
            ],
        )
        for algo, extra in DIAGNOSED.items()
    }
)
@pytest.mark.parametrize("algo", sorted(DIAGNOSED))
def test_diagnostics_in_every_row_and_the_same_on_any_layout(tmp_path, algo, ranked_run):
    """Every round carries the diagnostics (evaluated or not), and 1 process equals 3 ranks in them."""
    rows = metric_lines(ranked_run.same_as_one_process(tmp_path))
    assert [("test_acc" in r) for r in rows] == [False, True, True]
    for row in rows:
        assert all(key in row for key in DIAGNOSTICS), row.keys()
        assert 0 < row["spectral_gap"] <= 1 and row["consensus_distance"] > 0
        assert row["edge_bytes_min"] <= row["edge_bytes_mean"] <= row["edge_bytes_max"]
        if algo == "ntk-dfl":  # two Jacobian batches: two peer steps per peer per round
            assert sum(row["ntk_t_hist"].values()) == 2 * 10
            assert set(row["ntk_t_hist"]) <= {"50", "100", "200"}
    if algo == "dfedavg":  # offline peers send nothing: some edge carried one direction's weights, or none
        assert any(r["edge_bytes_min"] < r["edge_bytes_max"] for r in rows)


def test_centralized_runs_have_no_graph_diagnostics(tmp_path):
    result = run_here(
        "--dataset",
        "synthetic",
        "--peers",
        "6",
        "--rounds",
        "1",
        "--algo",
        "fedavg",
        "--local-epochs",
        "1",
        "--no-progress",
        "--out",
        str(tmp_path / "run"),
    )
    assert result.returncode == 0, result.stderr
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert not any(key in row for key in DIAGNOSTICS)
