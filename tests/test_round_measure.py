"""A round is measured in one place: a round that is not evaluated costs at most 3 collectives, no
collective ever carries every peer's weights to rank 0, and a metric is one declaration that reaches
the row, the docs' table and, if it is one, the list of machine facts."""

import numpy as np
import pytest
import torch

import p2pfl
from p2pfl import comm
from p2pfl.measure import metrics
from p2pfl.comm import LocalTransport
from p2pfl.docs import metrics_table
from p2pfl.testing import assert_same_results, run_in_process, run_many_under_mpirun

COLLECTIVES = ("gather", "gather_rows", "bcast", "agree", "barrier", "reduce", "allreduce")
TINY = dict(dataset="synthetic", peers=12, rounds=4, local_epochs=1, progress=False, out=None)


class CountingTransport(LocalTransport):
    """Every collective a round makes, with the most numbers it carried."""

    calls: list = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in COLLECTIVES:
            setattr(self, name, self.counted(name, getattr(self, name)))

    def counted(self, name, method):
        def call(*args):
            CountingTransport.calls.append((self.round_index, name, max(map(numbers, args), default=0)))
            return method(*args)

        return call


def numbers(obj) -> int:
    """The most numbers in one tensor or array anywhere in obj."""
    if isinstance(obj, (torch.Tensor, np.ndarray)):
        return obj.numel() if isinstance(obj, torch.Tensor) else obj.size
    if isinstance(obj, dict):
        return max(map(numbers, obj.values()), default=0)
    if isinstance(obj, (list, tuple)):
        return max((numbers(v) for v in obj if not isinstance(v, (int, float))), default=len(obj))
    if hasattr(obj, "__dataclass_fields__"):
        return max((numbers(getattr(obj, f)) for f in obj.__dataclass_fields__), default=0)
    return 0


@pytest.mark.parametrize(
    "algo, extra",
    [
        ("dfedavg", dict(kappa=3)),
        ("dispfl", dict(kappa=3)),
        ("fedavg", dict(topology="star", clients_per_round=4)),
        ("ntk-dfl", dict(kappa=3, samples_per_peer=20)),
    ],
)
def test_a_round_not_evaluated_makes_at_most_3_collectives_and_none_carries_every_peers_weights(
    monkeypatch, algo, extra
):
    monkeypatch.setattr(comm, "LocalTransport", CountingTransport)
    CountingTransport.calls = []
    result = p2pfl.simulate(algo, **{**TINY, "rounds": 5}, **extra, eval_every=2)  # the last round's finish aside
    width = int(result.model_state and sum(v.numel() for v in result.model_state.values()))
    by_round = {}
    for k, name, size in CountingTransport.calls:
        by_round.setdefault(k, []).append((name, size))
    for k in (2,):  # round 3, not evaluated, after the first round's one-off set-up
        assert len(by_round[k]) <= 3, by_round[k]
    for k in (1, 3):  # evaluated rounds: sums over the peers, never P x D numbers gathered
        assert len(by_round[k]) <= 5, by_round[k]
    during = [(name, size) for k, name, size in CountingTransport.calls if k < 4]
    assert max(size for _, size in during) <= 2 * width + 1 and "gather_rows" not in {name for name, _ in during}


def test_a_metric_is_one_declaration_in_the_row_the_docs_table_and_the_machine_facts():
    try:
        metrics.declare_metric(
            "peers_per_rank",
            meaning="a test's metric: peers over ranks",
            unit="peers",
            machine=True,
            value=lambda facts: facts.peers / len(facts.ranks),
        )
        rows = p2pfl.simulate("dfedavg", **TINY, kappa=3).rows
        assert all(row["peers_per_rank"] == 12.0 for row in rows)
        assert "| `peers_per_rank` | a test's metric: peers over ranks" in metrics_table()
        assert "peers_per_rank" in metrics.machine_facts()
    finally:
        del metrics.METRICS["peers_per_rank"]
    assert "peers_per_rank" not in metrics.machine_facts()


def test_the_docs_metrics_table_is_the_declarations():
    from pathlib import Path

    from p2pfl.docs import METRICS_BEGIN, METRICS_END

    text = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text()
    assert text.split(METRICS_BEGIN)[1].split(METRICS_END)[0].strip() == metrics_table()


@pytest.mark.mpi
def test_the_sums_over_ranks_are_the_same_on_one_and_three_ranks(tmp_path):
    """The reported model, the inter-model variance and the consensus distance come from sums over a
    tree of the ranks; on 3 ranks they are the numbers of one process, for a graph and a star."""
    common = ["--dataset", "synthetic", "--peers", "7", "--rounds", "3", "--local-epochs", "1", "--no-progress"]
    cases = {
        "dispfl": [*common, "--algo", "dispfl", "--kappa", "2", "--client-test-samples", "100"],
        "fedavg": [*common, "--algo", "fedavg", "--topology", "star", "--clients-per-round", "3"],
        "dfedavg": [
            *common,
            "--algo",
            "dfedavg",
            "--kappa",
            "2",
            "--aggregate",
            "sample-weighted",
            "--partition",
            "dirichlet",
        ],
    }
    for name, args in cases.items():
        assert run_in_process([*args, "--out", str(tmp_path / "one" / name)]).returncode == 0
    ranked = {name: [*args, "--out", str(tmp_path / "three" / name)] for name, args in cases.items()}
    for name, done in run_many_under_mpirun(ranked, 3, tmp_path / "mpirun").items():
        assert done.returncode == 0, done.stderr[-2000:]
        assert_same_results(tmp_path / "one" / name, tmp_path / "three" / name, name)
