"""--partition-file: a run on a split read from a file (the reference codes' pickled dicts, .json, .npz)."""

import json
import pickle

import numpy as np
import pytest

from p2pfl.data import load_dataset, partition, read_partition_file
from p2pfl.errors import UserError
from p2pfl.testing import MACHINE_FACTS
from tests.conftest import run_here

SHARDS = {0: np.array([5, 1, 3], dtype=np.int64), 1: np.array([0, 2]), 2: np.array([9, 4, 7, 8])}


def _write(tmp_path, kind, shards=SHARDS):
    path = tmp_path / f"part.{kind}"
    if kind == "dat":  # as the NTK-FL/NTK-DFL reference codes ship theirs
        path.write_bytes(pickle.dumps({k: np.asarray(v) for k, v in shards.items()}))
    elif kind == "json":
        path.write_text(json.dumps({str(k): np.asarray(v).tolist() for k, v in shards.items()}))
    else:
        np.savez(path, **{str(k): np.asarray(v) for k, v in shards.items()})
    return path


@pytest.mark.parametrize("kind", ["dat", "json", "npz"])
def test_each_format_gives_the_first_peers_sorted(tmp_path, kind):
    shards = read_partition_file(str(_write(tmp_path, kind)), 2, 10)
    assert [s.tolist() for s in shards] == [[1, 3, 5], [0, 2]]
    assert all(s.dtype == np.int64 for s in shards)


def test_a_json_list_is_peers_in_order(tmp_path):
    path = tmp_path / "part.json"
    path.write_text("[[3, 1], [2]]")
    assert [s.tolist() for s in read_partition_file(str(path), 2, 4)] == [[1, 3], [2]]


class _Runs:
    def __reduce__(self):
        return (print, ("a pickle ran code",))


def test_a_pickle_that_would_run_code_is_refused_unrun(tmp_path, capsys):
    path = tmp_path / "part.dat"
    path.write_bytes(pickle.dumps({0: _Runs()}))
    with pytest.raises(UserError, match="cannot be read"):
        read_partition_file(str(path), 1, 10)
    assert "a pickle ran code" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "shards,needle",
    [
        ({0: [1], 1: [11]}, "index 11, outside the 10 training samples"),
        ({0: [1], 1: [-1]}, "index -1, outside"),
        ({0: [1]}, "holds 1 peers; peer 1 of the run's 2"),
        ({0: [1], 1: []}, "peer 1 needs a non-empty list of integer indices"),
        ({0: [1], 1: [0.5]}, "integer indices"),
        ({"a": [1], 1: [2]}, "peer 'a' is not a number"),
        ({0: [1], 1: [[1, 2], [3]]}, "peer 1 needs a non-empty list of integer indices"),
    ],
)
def test_bad_maps_are_named(tmp_path, shards, needle):
    path = tmp_path / "part.json"
    path.write_text(json.dumps({str(k): v for k, v in shards.items()}))
    with pytest.raises(UserError, match=needle.replace("(", r"\(")):
        read_partition_file(str(path), 2, 10)


def test_not_a_map(tmp_path):
    path = tmp_path / "part.json"
    path.write_text('"peers"')
    with pytest.raises(UserError, match="expected a map from peer to training indices"):
        read_partition_file(str(path), 1, 10)


def test_a_run_on_a_file_equals_the_run_that_drew_it(tmp_path):
    """The file path feeds the algorithm exactly the shards it holds: written from the partition a run
    draws, it gives that run's metrics, every field but time and memory."""
    data = load_dataset("synthetic")
    drawn = partition(data.train_y.numpy(), data.train_classes, 6, "dirichlet", per_peer=40, alpha=0.3, seed=3)
    path = _write(tmp_path, "dat", dict(enumerate(drawn)))
    common = [
        "--dataset",
        "synthetic",
        "--peers",
        "6",
        "--kappa",
        "2",
        "--rounds",
        "2",
        "--local-epochs",
        "1",
        "--no-progress",
    ]
    runs = {}
    for name, extra in (
        ("drawn", ["--alpha", "0.3", "--samples-per-peer", "40", "--seed", "3"]),
        ("file", ["--seed", "3", "--partition-file", str(path)]),
    ):
        done = run_here(*common, *extra, "--out", str(tmp_path / name))
        assert done.returncode == 0, done.stderr
        runs[name] = [
            {k: v for k, v in json.loads(line).items() if k not in MACHINE_FACTS}
            for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        ]
    assert runs["file"] == runs["drawn"]
    assert (tmp_path / "file" / "partition.json").read_text() == (tmp_path / "drawn" / "partition.json").read_text()


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--partition-file", "{tmp}/absent.dat"], "no such file"),
        (["--partition-file", "{tmp}/part.dat", "--train-samples", "100"], "would renumber it"),
        (["--partition-file", "{tmp}/garbage.dat"], "cannot be read as .json, .npz or a pickled dict"),
        (["--partition-file", "{tmp}/garbage.npz"], "cannot be read as .json, .npz or a pickled dict"),
        (["--partition-file", "{tmp}/cut.dat"], "cannot be read as .json, .npz or a pickled dict"),
    ],
)
def test_cli_refuses_in_one_line(tmp_path, extra, needle):
    _write(tmp_path, "dat")
    (tmp_path / "garbage.dat").write_bytes(b"\x00 not a pickle")
    (tmp_path / "garbage.npz").write_bytes(b"PK\x03\x04 a cut zip")
    (tmp_path / "cut.dat").write_bytes((tmp_path / "part.dat").read_bytes()[:40])
    argv = [a.replace("{tmp}", str(tmp_path)) for a in extra]
    done = run_here(
        "--dataset",
        "synthetic",
        "--peers",
        "3",
        "--kappa",
        "2",
        "--rounds",
        "1",
        *argv,
        "--out",
        str(tmp_path / "run"),
        "--no-progress",
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and needle in lines[0], done.stderr
    assert not (tmp_path / "run").exists()
