import numpy as np
import pytest

from p2pfl.data import DataRequest, load_dataset, partition
from p2pfl.data.idx import read_idx
from p2pfl.errors import UserError
from tests.conftest import write_idx


@pytest.mark.parametrize("gz", [True, False])
def test_idx_roundtrip(tmp_path, gz):
    a = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    path = write_idx(tmp_path / "x-idx3-ubyte", a, gz=gz)
    assert np.array_equal(read_idx(path), a)


def test_idx_read_twice_is_read_once_and_a_changed_file_again(tmp_path, monkeypatch):
    """A process keeps a file's bytes while its size and time stay the same; each read is a fresh copy."""
    import gzip
    import os

    opened, real_open = [], gzip.open
    monkeypatch.setattr(
        gzip, "open", lambda path, mode="rb": (mode == "rb" and opened.append(path)) or real_open(path, mode)
    )
    a = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    path = write_idx(tmp_path / "x-idx3-ubyte", a)
    first = read_idx(path)
    first[0, 0, 0] = 99  # the caller's copy: the next read does not see it
    assert np.array_equal(read_idx(path), a) and len(opened) == 1
    assert write_idx(tmp_path / "x-idx3-ubyte", a + 1) == path
    os.utime(path, ns=(1, 1))  # another time, as a rewritten file has
    assert np.array_equal(read_idx(path), a + 1) and len(opened) == 2


def test_idx_bad_magic(tmp_path):
    (tmp_path / "bad").write_bytes(b"\x01\x02\x03\x04hello")
    with pytest.raises(UserError, match="not an IDX file"):
        read_idx(tmp_path / "bad")


def test_idx_truncated_plain(tmp_path):
    path = write_idx(tmp_path / "x", np.zeros((5, 4, 4), np.uint8), gz=False)
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(UserError, match="truncated"):
        read_idx(path)


def test_load_mnist_from_data_dir(tiny_mnist):
    ds = load_dataset("mnist", DataRequest(str(tiny_mnist)))
    assert ds.train_x.shape == (600, 1, 28, 28) and ds.test_x.shape == (100, 1, 28, 28) and ds.n_classes == 10
    assert abs(float(ds.train_x.mean())) < 5  # normalised, not raw bytes


def test_load_from_env_var(tiny_mnist, monkeypatch):
    monkeypatch.setenv("P2PFL_DATA", str(tiny_mnist))
    assert load_dataset("mnist").train_x.shape[0] == 600


LABELS = np.repeat(np.arange(10), 600)  # 6,000 samples, 10 balanced classes


def test_dirichlet_per_peer_sizes_and_skew():
    shards = partition(LABELS, 10, 50, "dirichlet", per_peer=100, alpha=0.1, classes=2, style="per-peer", seed=0)
    sizes = [len(s) for s in shards]
    assert len(shards) == 50 and max(sizes) <= 100 and min(sizes) >= 91  # floor loses at most C-1
    dominant = [np.bincount(LABELS[s], minlength=10).max() / len(s) for s in shards]
    assert np.mean(dominant) > 0.6  # alpha 0.1: most of a peer's data is one class
    iid_like = partition(LABELS, 10, 50, "dirichlet", per_peer=100, alpha=100.0, classes=2, style="per-peer", seed=0)
    assert np.mean([np.bincount(LABELS[s], minlength=10).max() / len(s) for s in iid_like]) < 0.25


def test_partitions_are_pure_functions_of_seed():
    a = partition(LABELS, 10, 20, "dirichlet", per_peer=100, alpha=0.5, classes=2, style="per-peer", seed=4)
    b = partition(LABELS, 10, 20, "dirichlet", per_peer=100, alpha=0.5, classes=2, style="per-peer", seed=4)
    c = partition(LABELS, 10, 20, "dirichlet", per_peer=100, alpha=0.5, classes=2, style="per-peer", seed=5)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_dirichlet_per_class_is_disjoint_and_complete():
    shards = partition(LABELS, 10, 20, "dirichlet", per_peer=200, alpha=0.5, classes=2, style="per-class", seed=0)
    everything = np.concatenate(shards)
    assert len(everything) == 20 * 200 == len(np.unique(everything))
    assert min(len(s) for s in shards) >= 10


def test_iid_is_disjoint_and_equal():
    shards = partition(LABELS, 10, 30, "iid", per_peer=200, alpha=1.0, classes=2, style="per-peer", seed=0)
    assert all(len(s) == 200 for s in shards) and len(np.unique(np.concatenate(shards))) == 6000


def test_classes_per_peer():
    shards = partition(LABELS, 10, 30, "classes", per_peer=100, alpha=1.0, classes=3, style="per-peer", seed=0)
    assert all(len(np.unique(LABELS[s])) == 3 and len(s) == 100 for s in shards)
    assert len(np.unique(np.concatenate(shards))) == 3000  # disjoint
