"""Beyond the MLP: models, tasks, CIFAR / FEMNIST readers, the papers' partitions, algorithm settings."""

import json
import pickle

import numpy as np
import pytest
import torch

from p2pfl.algorithms.star.scaffold import ScaffoldUpload
from p2pfl.data import DataRequest, load_dataset, partition
from p2pfl.errors import UserError
from p2pfl.models import MODELS, PeerStack, build_model, count_parameters, initial_parameters
from p2pfl.algorithms.ntk_options import JacobianMessage
from p2pfl.run import main
from p2pfl.local.training import SGDSettings, train_epochs
from tests.conftest import run_cli, run_here, write_cifar, write_femnist


class Options:
    hidden, norm, rep_dim = [100], "batch", 5


@pytest.mark.parametrize("name", sorted(set(MODELS) - {"linear-rep"}))
def test_every_model_builds_for_both_image_sizes(name):
    for shape, classes in (((1, 28, 28), 10), ((3, 32, 32), 100)):
        model = build_model(name, shape, classes, Options)
        out = model.eval()(torch.zeros(2, *shape))
        assert out.shape == (2, classes)


def test_simple_cnn_exceeds_tcts_coordinate_count():
    assert count_parameters(build_model("simple-cnn", (1, 28, 28), 10, Options)) == 147_146 > 100_000


def _shards(sizes):
    start = np.cumsum([0, *sizes])
    return [torch.arange(a, b) for a, b in zip(start, start[1:])]


@pytest.mark.parametrize("name,shape", [("resnet8", (3, 32, 32)), ("cnn-fmnist", (1, 28, 28))])
def test_batched_training_equals_one_peer_at_a_time(name, shape):
    """Batch norm statistics over ragged batches and per-peer dropout masks: the vmap batch of a rank's
    peers must give every peer what training it alone gives."""
    torch.manual_seed(0)
    # float64: over a batch of one sample, batch norm divides by a channel's tiny spread and amplifies
    # float32 rounding (the two paths differed by 5e-4 on an AVX2 machine, by 1e-16 in float64)
    model = build_model(name, shape, 10, Options).double()
    x, y = torch.randn(40, *shape, dtype=torch.float64), torch.randint(0, 10, (40,))
    shards = _shards([7, 12, 9])  # last batches of 3, 4 and 1 samples with batch 4
    opt = SGDSettings(batch_size=4, epochs=1, momentum=0.5)
    out = {}
    for batched in (True, False):
        stack = PeerStack(model, batched)
        stack.batched = batched  # conv nets default to one peer at a time; the vmap path must agree too
        flat = initial_parameters(model, [0, 1, 2], 3, "different", torch.device("cpu")).double()
        train_epochs(stack, flat, shards, [0, 1, 2], x, y, opt, 0.05, 5, 0)
        out[batched] = flat
    assert torch.allclose(out[True], out[False], atol=1e-10, rtol=1e-9)
    if name == "resnet8":  # running statistics travel in the row and were updated
        layout = PeerStack(model).layout
        assert layout.size > layout.trainable
        assert not torch.allclose(
            out[True][:, layout.trainable :],
            initial_parameters(model, [0], 3, "same", torch.device("cpu")).double()[:, layout.trainable :],
        )


@pytest.mark.parametrize(
    "name,kind", [("cifar10", "binary"), ("cifar10", "python"), ("cifar100", "binary"), ("cifar100", "python")]
)
def test_cifar_layouts_load(tmp_path, name, kind):
    write_cifar(tmp_path, name, kind)
    fine = load_dataset(name, DataRequest(str(tmp_path)))
    assert fine.train_x.shape == (60, 3, 32, 32) and fine.test_x.shape == (20, 3, 32, 32)
    assert fine.n_classes == (10 if name == "cifar10" else 100)
    assert fine.train_y.tolist()[:12] == [i % fine.n_classes for i in range(12)]
    if name == "cifar100":
        coarse = load_dataset(name, DataRequest(str(tmp_path), labels="coarse"))
        assert coarse.n_classes == 20 and coarse.train_y.tolist()[:12] == [i // 5 for i in range(12)]


def _one_error_line(capsys, argv):
    code = main([*argv, "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("p2pfl: error:"), err
    return err[0]


def test_cifar_truncated_binary_and_corrupt_pickle(tmp_path, capsys):
    folder = write_cifar(tmp_path / "bin", "cifar10", "binary")
    (folder / "data_batch_3.bin").write_bytes((folder / "data_batch_3.bin").read_bytes()[:-100])
    line = _one_error_line(
        capsys, ["--dataset", "cifar10", "--data-dir", str(tmp_path / "bin"), "--out", str(tmp_path / "r1")]
    )
    assert "truncated or corrupt" in line and "data_batch_3.bin" in line
    folder = write_cifar(tmp_path / "py", "cifar100", "python")
    (folder / "test").write_bytes((folder / "test").read_bytes()[:500])
    line = _one_error_line(
        capsys, ["--dataset", "cifar-100", "--data-dir", str(tmp_path / "py"), "--out", str(tmp_path / "r2")]
    )
    assert "truncated or corrupt" in line


class Foreign:
    pass


def test_cifar_pickle_naming_a_foreign_class_is_refused(tmp_path, capsys):
    folder = write_cifar(tmp_path, "cifar10", "python")
    with (folder / "data_batch_2").open("wb") as fh:
        pickle.dump({b"data": Foreign(), b"labels": [0]}, fh, protocol=2)
    line = _one_error_line(capsys, ["--dataset", "cifar10", "--data-dir", str(tmp_path), "--out", str(tmp_path / "r")])
    assert "Foreign" in line and "refusing" in line
    assert not (tmp_path / "r").exists()


def test_femnist_writers_and_corrupt_json(tmp_path, capsys):
    base = write_femnist(tmp_path)
    ds = load_dataset("femnist", DataRequest(str(tmp_path)))
    assert ds.train_x.shape == (60, 1, 28, 28) and ds.n_classes == 62 and ds.test_x.shape == (20, 1, 28, 28)
    shards = partition(ds.train_y.numpy(), 62, 4, "writers", groups=ds.groups)
    assert [len(s) for s in shards] == [12] * 4 and all(len(set(ds.groups[s])) == 1 for s in shards)
    with pytest.raises(UserError, match="only 5 writers"):
        partition(ds.train_y.numpy(), 62, 6, "writers", groups=ds.groups)
    path = next((base / "train").glob("*.json"))
    path.write_text(path.read_text()[:300])
    line = _one_error_line(capsys, ["--dataset", "femnist", "--data-dir", str(tmp_path), "--out", str(tmp_path / "r")])
    assert "truncated" in line


LABELS = np.repeat(np.arange(10), 60)


def test_niid_bench_classes_one_whole_class_each():
    shards = partition(LABELS, 10, 10, "classes", classes=1, classes_style="niid-bench", seed=3)
    assert [sorted(set(LABELS[s])) for s in shards] == [[i] for i in range(10)]
    assert all(len(s) == 60 for s in shards)


def test_niid_bench_two_classes_split_evenly_over_owners():
    shards = partition(LABELS, 10, 10, "classes", classes=2, classes_style="niid-bench", seed=0)
    assert all(i % 10 in set(LABELS[s]) and len(set(LABELS[s])) == 2 for i, s in enumerate(shards))
    assert len(np.concatenate(shards)) == 600 == len(np.unique(np.concatenate(shards)))


def test_feddyn_dirichlet_equal_sizes_disjoint_skewed():
    shards = partition(LABELS, 10, 10, "dirichlet", per_peer=50, alpha=0.1, style="feddyn", seed=0)
    assert all(len(s) == 50 for s in shards) and len(np.unique(np.concatenate(shards))) == 500
    assert np.mean([np.bincount(LABELS[s], minlength=10).max() / 50 for s in shards]) > 0.4


def test_niid_bench_from_the_cli_gives_one_whole_class(tiny_mnist, tmp_path):
    result = run_here(
        "--algo",
        "fedavg",
        "--model",
        "simple-cnn",
        "--dataset",
        "mnist",
        "--data-dir",
        str(tiny_mnist),
        "--peers",
        "10",
        "--partition",
        "classes",
        "--classes-style",
        "niid-bench",
        "--classes-per-peer",
        "1",
        "--rounds",
        "1",
        "--clients-per-round",
        "2",
        "--local-epochs",
        "1",
        "--test-samples",
        "20",
        "--no-progress",
        "--out",
        str(tmp_path / "r"),
    )
    assert result.returncode == 0, result.stderr
    parts = json.loads((tmp_path / "r" / "partition.json").read_text())
    assert [p["classes"] for p in parts] == [[60 if c == i else 0 for c in range(10)] for i in range(10)]


def test_payloads_round_trip_through_their_tensors():
    up = ScaffoldUpload(torch.ones(3), torch.zeros(3))
    back = ScaffoldUpload.from_tensors(up.tensors())
    assert torch.equal(back.delta_weights, up.delta_weights) and torch.equal(back.delta_control, up.delta_control)
    msg = JacobianMessage(torch.ones(2, 3), torch.arange(2), (torch.ones(2, 5), torch.ones(2, 4, dtype=torch.uint8)))
    again = JacobianMessage.from_tensors(msg.tensors())
    assert len(again.jacobian) == 2 and again.jacobian[1].dtype == torch.uint8


@pytest.mark.subprocess
def test_algorithm_help_lists_its_own_settings_only():
    result = run_cli("--algo", "fedprox", "--help")
    assert result.returncode == 0
    assert "--prox-mu" in result.stdout and "--clients-per-round" in result.stdout
    assert "--ntk-taus" not in result.stdout and "--share-fraction" not in result.stdout


@pytest.mark.parametrize(
    "text,needle",
    [
        ('algo = "fedavg"\nprox_mu = 0.1\n', "does not apply to --algo fedavg"),
        ('algo = "fedprox"\nprox_mu = "a lot"\n', "--prox-mu takes a finite number"),
        ('lr = "0.1"\n', "--lr takes a finite number"),
        ('algo = "ntk-dfl"\nntk_taus = [100, 0]\n', "--ntk-taus needs positive integers"),
        ('algo = "ntk-dfl"\nntk_ode = "rk4"\n', "--ntk-ode must be one of"),
        ('save_edges = "no"\n', "--save-edges takes true or false"),
    ],
)
def test_settings_from_toml_are_typed_and_checked(tmp_path, capsys, text, needle):
    cfg = tmp_path / "run.toml"
    cfg.write_text(text)
    assert needle in _one_error_line(capsys, ["--config", str(cfg), "--out", str(tmp_path / "r")])


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--model", "resnet18", "--dataset", "synthetic"], "needs images"),
        (["--model", "linear-rep"], "is for regression"),
        (["--algo", "ntk-dfl", "--dataset", "linear-rep"], "learns classification only"),
        (["--partition", "writers"], "needs a dataset with a natural split"),
        (
            [
                "--algo",
                "ntk-dfl",
                "--model",
                "simple-cnn",
                "--ntk-jacobian",
                "factored",
                "--peers",
                "4",
                "--kappa",
                "2",
                "--samples-per-peer",
                "5",
            ],
            "serves MLPs only",
        ),
        (["--algo", "fedavg", "--peers", "5", "--clients-per-round", "6"], "exceeds the 5 clients"),
        (["--norm", "layer"], "unknown norm"),
    ],
)
def test_model_data_algorithm_mismatch(argv, needle, capsys, tmp_path):
    assert needle in _one_error_line(capsys, [*argv, "--out", str(tmp_path / "r")])


def test_regression_run_writes_loss_metrics_and_plot(tmp_path):
    result = run_here(
        "--algo",
        "fedavg",
        "--dataset",
        "linear-rep",
        "--peers",
        "8",
        "--clients-per-round",
        "8",
        "--samples-per-peer",
        "50",
        "--rounds",
        "3",
        "--lr",
        "0.05",
        "--local-steps",
        "2",
        "--batch-size",
        "50",
        "--no-progress",
        "--out",
        str(tmp_path / "r"),
    )
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert "test_acc" not in rows[0] and {"test_loss", "client_loss_mean", "train_loss"} <= set(rows[0])
    assert rows[-1]["test_loss"] < rows[0]["test_loss"]
    assert (tmp_path / "r" / "loss.png").stat().st_size > 0 and not (tmp_path / "r" / "accuracy.png").exists()
    assert "model linear-rep: 505 parameters" in (tmp_path / "r" / "config.toml").read_text()


def test_the_settings_tables_are_generated_from_the_declarations():
    from pathlib import Path

    from p2pfl.docs import BEGIN, END, RUN_BEGIN, RUN_END, run_table, tables

    page = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    assert page.split(BEGIN, 1)[1].split(END, 1)[0].strip() == tables().strip()
    assert page.split(RUN_BEGIN, 1)[1].split(RUN_END, 1)[0].strip() == run_table().strip()


def test_dense_jacobian_of_a_batch_norm_net_matches_autograd():
    """Dense Jacobians (any model) are taken in evaluation mode over the trainable parameters: J^T R must
    equal the gradient of sum(R * f) through the network, and leave the running statistics alone."""
    from p2pfl.ntk import DenseJacobian

    model = build_model("resnet8", (3, 8, 8), 4, Options)
    stack = PeerStack(model)
    flat = initial_parameters(model, [0], 1, "same", torch.device("cpu"))[0]
    flat[stack.layout.trainable :] += torch.rand(stack.layout.size - stack.layout.trainable)  # non-trivial stats
    x, R = torch.randn(3, 3, 8, 8), torch.randn(1, 3, 4)
    jac, f = DenseJacobian.compute(model, stack.layout, flat, x, chunk=2)
    assert jac.J.shape == (3, 4, stack.layout.trainable)
    views = list(stack.layout.views(flat).items())
    params = {k: v.detach().clone().requires_grad_(True) for k, v in views[: stack.layout.n_params]}
    buffers = {k: v.detach() for k, v in views[stack.layout.n_params :]}
    out = torch.func.functional_call(model.eval(), {**params, **buffers}, (x,))
    assert torch.allclose(out, f, atol=1e-5)
    grad = torch.cat([g.reshape(-1) for g in torch.autograd.grad((R[0] * out).sum(), list(params.values()))])
    update = jac.transpose_apply(None, flat, R)[0]
    assert torch.allclose(update[: stack.layout.trainable], grad, atol=1e-4, rtol=1e-4)
    assert torch.all(update[stack.layout.trainable :] == 0)
