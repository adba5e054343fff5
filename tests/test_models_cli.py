"""Every model trains from the CLI with FedAvg and DFedAvg and writes the usual run folder; the CNN
path under mpirun equals one process; NTK-DFL runs a CNN on the dense path within its memory cap."""

import json
import re
from pathlib import Path

import pytest

from tests.conftest import ranked_cases, run_cli, run_here, write_cifar, write_femnist

FMNIST = Path("/usr/share/datasets/fashion-mnist")
SMALL = [
    "--peers",
    "3",
    "--kappa",
    "2",
    "--rounds",
    "2",
    "--samples-per-peer",
    "8",
    "--batch-size",
    "4",
    "--local-epochs",
    "1",
    "--test-samples",
    "16",
    "--lr",
    "0.01",
    "--no-progress",
]
CASES = [
    ("mlp", "mnist", []),
    ("simple-cnn", "mnist", []),
    ("cnn-fmnist", "mnist", []),
    ("cnn-femnist", "femnist", []),
    ("lenet5", "cifar10", []),
    ("cnn-cifar", "cifar10", []),
    ("resnet8", "cifar100", ["--labels", "coarse"]),
    pytest.param("resnet18", "cifar10", ["--norm", "batch"], marks=pytest.mark.slow),  # slow: 11 million weights
    pytest.param("resnet18", "cifar10", ["--norm", "group"], marks=pytest.mark.slow),
]
CASE_IDS = [f"{m}-{d}{''.join(e)}" for m, d, e in (case.values if hasattr(case, "values") else case for case in CASES)]


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    write_cifar(root, "cifar10", "binary")
    write_cifar(root, "cifar100", "python")
    write_femnist(root)
    return write_noise_mnist(root)


def write_noise_mnist(root: Path) -> Path:
    """MNIST's IDX files of 60 training and 20 test images of noise, labels cycling through 10 classes."""
    import numpy as np

    from tests.conftest import write_idx

    rng = np.random.default_rng(0)
    for split, n in (("train", 60), ("t10k", 20)):
        write_idx(root / f"{split}-images-idx3-ubyte", rng.integers(0, 255, (n, 28, 28)).astype(np.uint8))
        write_idx(root / f"{split}-labels-idx1-ubyte", (np.arange(n) % 10).astype(np.uint8))
    return root


@pytest.mark.parametrize("algo", ["fedavg", "dfedavg"])
@pytest.mark.parametrize("model,dataset,extra", CASES, ids=CASE_IDS)
def test_model_trains_two_rounds(data_root, tmp_path, model, dataset, extra, algo):
    partition = ["--partition", "writers"] if dataset == "femnist" else ["--partition", "iid"]
    star = ["--clients-per-round", "2"] if algo == "fedavg" else []
    out = tmp_path / "run"
    result = run_here(
        "--algo",
        algo,
        "--model",
        model,
        "--dataset",
        dataset,
        "--data-dir",
        str(data_root),
        *SMALL,
        *partition,
        *star,
        *extra,
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and 0 <= rows[-1]["test_acc"] <= 1 and rows[-1]["bytes_sent"] > 0
    for name in ("config.toml", "accuracy.png", "topology.png", "partition.json", "model.pt"):
        assert (out / name).exists(), name
    assert f"model {model}:" in (out / "config.toml").read_text()


@ranked_cases(
    {
        "": (
            3,
            lambda data: [
                "--algo",
                "dfedavg",
                "--model",
                "simple-cnn",
                "--dataset",
                "mnist",
                "--data-dir",
                write_noise_mnist(data),
                "--peers",
                "5",
                "--kappa",
                "2",
                "--rounds",
                "2",
                "--samples-per-peer",
                "10",
                "--batch-size",
                "4",
                "--local-epochs",
                "1",
                "--partition",
                "dirichlet",
                "--alpha",
                "0.5",
                "--lr",
                "0.01",
                "--no-progress",
            ],
        )
    }
)
def test_simple_cnn_dfedavg_under_mpi_equals_single_process(tmp_path, ranked_run):
    ranked_run.same_as_one_process(tmp_path)


@pytest.mark.skipif(not FMNIST.exists(), reason="Fashion-MNIST (Debian's dataset-fashion-mnist) is not installed")
@pytest.mark.subprocess
def test_ntk_dfl_with_a_cnn_on_fashion_mnist_within_the_memory_cap(tmp_path):
    cap_gb = 2.0
    result = run_cli(
        "--algo",
        "ntk-dfl",
        "--model",
        "simple-cnn",
        "--dataset",
        "fashion-mnist",
        "--peers",
        "4",
        "--kappa",
        "2",
        "--rounds",
        "2",
        "--samples-per-peer",
        "10",
        "--test-samples",
        "500",
        "--ntk-taus",
        "100,200",
        "--ntk-memory-gb",
        str(cap_gb),
        "--no-progress",
        "--out",
        str(tmp_path / "r"),
    )
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and rows[-1]["bytes_by_phase"]["jacobians"] > 0
    assert rows[-1]["peak_rss_mb"] < 1024 * (cap_gb + 1.5)  # the Jacobians within the cap, plus torch and the data
    refused = run_cli(
        "--algo",
        "ntk-dfl",
        "--model",
        "simple-cnn",
        "--dataset",
        "fashion-mnist",
        "--peers",
        "4",
        "--kappa",
        "2",
        "--rounds",
        "1",
        "--samples-per-peer",
        "200",
        "--ntk-memory-gb",
        str(cap_gb),
        "--no-progress",
        "--out",
        str(tmp_path / "r2"),
    )
    assert refused.returncode == 2 and "above --ntk-memory-gb" in refused.stderr


DENSE_NTK = [
    "--algo",
    "ntk-dfl",
    "--dataset",
    "synthetic",
    "--ntk-jacobian",
    "dense",
    "--peers",
    "7",
    "--kappa",
    "2",
    "--rounds",
    "2",
    "--samples-per-peer",
    "20",
    "--ntk-taus",
    "50,100",
    "--lr",
    "0.1",
    "--no-progress",
]


def test_dense_jacobians_a_group_of_neighbourhoods_at_a_time_give_the_same_numbers(tmp_path, monkeypatch):
    """NTK-DFL holds dense Jacobians one group of neighbourhoods at a time; the groups change what is held,
    not the results: one neighbourhood a group equals all in one, in every metric."""
    from p2pfl.ntk.plan import JacobianPlan
    from p2pfl.testing import assert_same_results

    assert run_here(*DENSE_NTK, "--out", str(tmp_path / "default")).returncode == 0
    groups = []
    monkeypatch.setattr(JacobianPlan, "groups", lambda self, hood: groups.append(1) or [{p} for p in hood])
    assert run_here(*DENSE_NTK, "--out", str(tmp_path / "singles")).returncode == 0
    assert groups  # the run took the patched groups
    assert_same_results(tmp_path / "default", tmp_path / "singles", "one neighbourhood a group")


@ranked_cases({"": (3, [*DENSE_NTK, "--ntk-memory-gb", "0.23", "--peers", "14"])})
def test_dense_jacobian_groups_under_mpi_equal_one_process(tmp_path, ranked_run):
    """A cap that fits a few neighbourhoods: several 'jacobians' exchanges a round (other groups on 3 ranks,
    which hold a third copy), the same numbers. (The cap also sets jacrev's chunk of samples; below a
    peer's 20 samples, a chunk's rounding depends on the thread count, hence on the layout.)"""
    note = (ranked_run.same_as_one_process(tmp_path) / "config.toml").read_text()
    exchanges = int(re.search(r"\((\d+) Jacobian exchanges in round 1\)", note).group(1))
    assert exchanges >= 2


def test_dense_ntk_dfl_is_refused_only_when_one_neighbourhood_cannot_fit(tmp_path):
    refused = run_here(*DENSE_NTK, "--ntk-memory-gb", "0.02", "--out", str(tmp_path / "x"))
    assert refused.returncode == 2, refused.stderr
    assert "one neighbourhood's" in refused.stderr and "above --ntk-memory-gb" in refused.stderr
