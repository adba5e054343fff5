"""Output paths, overwritten folders, pickles and damaged data at their edges: one line and exit 2 (5
for a write that fails mid-run), never a traceback, never a run folder holding two runs."""

import json
import pickle
import resource
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import ROOT, run_here, write_cifar, write_femnist, write_idx, write_stripes

SYN = [
    "--dataset",
    "synthetic",
    "--peers",
    "6",
    "--kappa",
    "2",
    "--rounds",
    "1",
    "--local-epochs",
    "1",
    "--no-progress",
]


def _one_line(result):
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


@pytest.mark.parametrize(
    "out,needle",
    [
        ("x" * 300, "a name of 300 characters"),
        ("é" * 200, "a name of 200 characters (éééééééééééééééééééé...), 400 bytes; at most 255 bytes"),
        ("d/" * 2600, "characters long; use a shorter path"),
        ("dangling/run", "is a link to nothing"),
    ],
)
def test_an_out_no_file_system_takes_is_one_line(tmp_path, out, needle):
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    result = run_here(*SYN, "--out", str(tmp_path / out))
    assert result.returncode == 2 and needle in _one_line(result)


@pytest.mark.subprocess
def test_a_write_that_fails_mid_run_is_one_line_and_what_was_written_stays_readable(tmp_path):
    """A file-size limit (as a full disk does) hits the run's checkpoint: it stops naming the file, exit 5,
    and metrics.jsonl holds whole lines."""

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))

    out = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "p2pfl.run",
            *SYN,
            "--rounds",
            "50",
            "--checkpoint-every",
            "1",
            "--peers",
            "12",
            "--kappa",
            "3",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        preexec_fn=limit,
        timeout=300,
    )
    line = _one_line(result)
    assert result.returncode == 5 and "cannot write" in line and str(out) in line
    rows = [json.loads(row) for row in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == list(range(1, len(rows) + 1))


def test_overwrite_removes_what_the_replaced_run_wrote(tmp_path):
    out = tmp_path / "run"
    assert run_here(*SYN, "--algo", "ntk-dfl", "--ntk-taus", "50,100", "--out", str(out)).returncode == 0
    assert (out / "final.json").exists() and (out / "final_averaging.png").exists()
    (out / "my-notes.txt").write_text("mine")
    assert run_here(*SYN, "--algo", "dfedavg", "--out", str(out), "--overwrite").returncode == 0
    final = json.loads((out / "final.json").read_text())  # DFedAvg's own: its graph's gap, nothing of NTK-DFL's
    assert list(final) == ["spectral_gap", "sim_time_s"] and not (out / "final_averaging.png").exists()
    assert (out / "my-notes.txt").read_text() == "mine" and 'algo = "dfedavg"' in (out / "config.toml").read_text()


def test_numpy_2_pickles_at_protocol_5_are_read(tmp_path):
    shards = {p: np.arange(p * 50, p * 50 + 40) for p in range(6)}
    with (tmp_path / "split.pkl").open("wb") as fh:
        pickle.dump(shards, fh, protocol=5)
    assert b"_frombuffer" in (tmp_path / "split.pkl").read_bytes()
    assert run_here(*SYN, "--partition-file", str(tmp_path / "split.pkl"), "--out", str(tmp_path / "a")).returncode == 0
    folder = write_cifar(tmp_path / "c", kind="python", n_train=60, n_test=20)
    for path in folder.iterdir():  # the same batches, pickled again by numpy 2 at protocol 5
        batch = pickle.loads(path.read_bytes(), encoding="bytes")
        path.write_bytes(pickle.dumps({k: np.asarray(v) if k == b"data" else v for k, v in batch.items()}, protocol=5))
    result = run_here(
        "--dataset",
        "cifar10",
        "--data-dir",
        str(tmp_path / "c"),
        "--peers",
        "4",
        "--kappa",
        "2",
        "--rounds",
        "1",
        "--samples-per-peer",
        "10",
        "--no-progress",
        "--out",
        str(tmp_path / "b"),
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.subprocess
def test_a_pickle_bomb_is_refused_not_built(tmp_path):
    nested = [1] * 10
    for _ in range(11):  # 10^12 entries from 283 bytes: every level shares the one below
        nested = [nested] * 10
    with (tmp_path / "bomb.pkl").open("wb") as fh:
        pickle.dump({p: nested for p in range(6)}, fh)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "p2pfl.run",
            *SYN,
            "--partition-file",
            str(tmp_path / "bomb.pkl"),
            "--out",
            str(tmp_path / "r"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "needs a non-empty list of integer indices" in _one_line(result)


def _femnist(tmp_path, damage):
    base = write_femnist(tmp_path / "f")
    first = sorted((base / "train").glob("*.json"))[0]
    if damage == "a folder":
        (base / "train" / "z.json").mkdir()
    elif damage == "a dangling link":
        (base / "train" / "z.json").symlink_to(tmp_path / "nowhere.json")
    elif damage == "NaN pixels":
        blob = json.loads(first.read_text())
        user = blob["users"][0]
        blob["user_data"][user]["x"][0][5] = float("nan")
        first.write_text(json.dumps(blob))
    return ["--dataset", "femnist", "--data-dir", str(tmp_path / "f")]


def _cifar(tmp_path, damage):
    folder = write_cifar(tmp_path / "c", kind="python", n_train=60, n_test=20)
    path = folder / "data_batch_1"
    batch = pickle.loads(path.read_bytes(), encoding="bytes")
    if damage == "string data":
        batch[b"data"] = "pixels"
    elif damage == "string labels":
        batch[b"labels"] = ["cat"] * len(batch[b"labels"])
    elif damage == "empty arrays":
        batch[b"data"], batch[b"labels"] = np.zeros((0, 3072), np.uint8), []
    elif damage == "float pixels":
        batch[b"data"] = batch[b"data"].astype(np.float32) / 255
    path.write_bytes(pickle.dumps(batch, protocol=2))
    return ["--dataset", "cifar10", "--data-dir", str(tmp_path / "c")]


def _idx(tmp_path, damage):
    root = write_stripes(tmp_path, 10, 60, 20)
    write_idx(root / "train-images-idx3-ubyte", np.zeros((60, 0, 0), np.uint8))
    return ["--dataset", "mnist", "--data-dir", str(root)]


@pytest.mark.parametrize(
    "make,damage,needle",
    [
        (_femnist, "a folder", "is a folder, not a LEAF JSON file"),
        (_femnist, "a dangling link", "is a link to nothing"),
        (_femnist, "NaN pixels", "has NaN or infinite pixels"),
        (_cifar, "string data", "'data' is not 8-bit pixels"),
        (_cifar, "string labels", "'labels' is not a list of integer labels"),
        (_cifar, "empty arrays", "is corrupt"),
        (_cifar, "float pixels", "'data' is not 8-bit pixels (it is float32)"),
        (_idx, "zero-size images", "have no pixels"),
    ],
)
def test_damaged_data_is_named_in_one_line(tmp_path, make, damage, needle):
    args = make(tmp_path, damage)
    result = run_here(
        *args,
        "--peers",
        "4",
        "--kappa",
        "2",
        "--rounds",
        "1",
        "--samples-per-peer",
        "5",
        "--no-progress",
        "--out",
        str(tmp_path / "r"),
    )
    assert result.returncode == 2 and needle in _one_line(result)
    assert not (tmp_path / "r").exists()


def test_a_partition_file_names_the_same_images_under_fedavg_ft(tmp_path):
    """FedAvg-FT keeps its held-out classes (8 and 9) out of training; the file's indices, written against
    the whole training set, still name the same images, and one naming a held-out image is refused."""
    from p2pfl.data import DataRequest, load_dataset

    labels = load_dataset("synthetic", DataRequest()).train_y.numpy()
    kept = np.flatnonzero(labels < 8)
    shards = {p: kept[p * 30 : (p + 1) * 30].tolist() for p in range(6)}
    (tmp_path / "split.json").write_text(json.dumps(shards))
    args = [*SYN, "--algo", "fedavg-ft", "--ft-trials", "1", "--partition-file", str(tmp_path / "split.json")]
    assert run_here(*args, "--out", str(tmp_path / "r")).returncode == 0
    counts = [p["classes"] for p in json.loads((tmp_path / "r" / "partition.json").read_text())]
    for p, index in shards.items():
        assert counts[p] == np.bincount(labels[index], minlength=10).tolist()
    config = (tmp_path / "r" / "config.toml").read_text()
    assert "alpha" not in config and "partition =" not in config  # the file replaced them: not recorded as used
    shards[2][0] = int(np.flatnonzero(labels == 9)[0])
    (tmp_path / "split.json").write_text(json.dumps(shards))
    result = run_here(*args, "--out", str(tmp_path / "s"))
    assert result.returncode == 2 and "keeps out of training" in _one_line(result)


@pytest.mark.parametrize(
    "refused,needle",
    [
        ("--peers abc", "--peers takes an integer, not 'abc'"),  # by the parser, on every rank
        ("--out {taken}", "already holds files"),  # by the checks of the resolved settings, as every other refusal
    ],
)
@pytest.mark.mpi
def test_launch_mpirun_ends_a_refused_run_with_our_line_alone(tmp_path, refused, needle):
    """Without Open MPI's banner, with exit 2. (What each refusal says: tests/test_cli_errors.py, in-process.)"""
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("x")
    args = refused.format(taken=tmp_path / "taken").split()
    result = subprocess.run(
        ["bash", str(ROOT / "launch" / "mpirun.sh"), "2", *SYN, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and needle in _one_line(result)


def test_a_folder_name_with_control_characters_round_trips_through_config_toml(tmp_path, tiny_mnist):
    """config.toml is written by tomli-w: a data folder whose name holds a newline, a tab and a control
    character reads back as it was, so the run resumes and its folder serves as --config."""
    import tomllib

    from p2pfl import testing

    odd = tmp_path / 'digits\n\t"\x01'
    odd.mkdir()
    for f in tiny_mnist.glob("*.gz"):
        f.rename(odd / f.name)
    args = [
        "--dataset",
        "mnist",
        "--data-dir",
        str(odd),
        "--peers",
        "4",
        "--kappa",
        "2",
        "--rounds",
        "2",
        "--samples-per-peer",
        "20",
        "--local-epochs",
        "1",
        "--no-progress",
        "--out",
        str(tmp_path / "run"),
    ]
    cut = testing.run_in_process(args, stop_after_first_round=True)
    assert cut.returncode == 130, cut.stderr[-2000:]
    config = tomllib.loads((tmp_path / "run" / "config.toml").read_text())
    assert config["data_dir"] == str(odd)
    resumed = testing.run_in_process(["--resume", str(tmp_path / "run"), "--no-progress"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    again = testing.run_in_process(["--config", str(tmp_path / "run" / "config.toml"), "--out", str(tmp_path / "b")])
    assert again.returncode == 0, again.stderr[-2000:]
    testing.assert_same_results(tmp_path / "run", tmp_path / "b", "a run from the first one's config.toml")
