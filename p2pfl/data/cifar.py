"""CIFAR-10 and CIFAR-100 from their official distributions: the binary version (fixed-size records:
label byte(s) then 3,072 pixel bytes) and the python version (pickled dicts, read as plain data by
p2pfl.data.plain_pickle: dicts, lists, bytes and numpy arrays)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from p2pfl.data.plain_pickle import PlainUnpickler, RefusedName, integers
from p2pfl.errors import UserError

PIXELS = 3 * 32 * 32
LAYOUTS = {  # dataset -> (binary folder, train files, test files), (python folder, train, test)
    "cifar10": (
        ("cifar-10-batches-bin", [f"data_batch_{i}.bin" for i in range(1, 6)], ["test_batch.bin"]),
        ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"]),
    ),
    "cifar100": (("cifar-100-binary", ["train.bin"], ["test.bin"]), ("cifar-100-python", ["train"], ["test"])),
}


def _read_pickle(path: Path) -> dict:
    try:
        with path.open("rb") as fh:
            obj = PlainUnpickler(fh, encoding="bytes").load()
    except RefusedName as exc:
        raise UserError(
            f"data file {path} names {exc} in its pickle, which a CIFAR file never holds; refusing to load it"
        ) from None
    except Exception as exc:  # truncated or corrupt: EOFError, UnpicklingError, ValueError, ...
        raise UserError(f"data file {path} is truncated or corrupt ({exc.__class__.__name__})")
    if not isinstance(obj, dict):
        raise UserError(f"data file {path} does not hold a CIFAR batch (a dict)")
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in obj.items()}


def _python_split(folder: Path, files: list[str], label_key: str) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for name in files:
        batch = _read_pickle(folder / name)
        if "data" not in batch or label_key not in batch:
            raise UserError(f"data file {folder / name} lacks 'data' or '{label_key}'")
        x, y = batch["data"], integers(batch[label_key])
        if not isinstance(x, np.ndarray) or x.dtype != np.uint8:
            raise UserError(
                f"data file {folder / name}: 'data' is not 8-bit pixels (it is {getattr(x, 'dtype', type(x).__name__)})"
            )
        if y is None:
            raise UserError(f"data file {folder / name}: '{label_key}' is not a list of integer labels")
        if x.ndim != 2 or x.shape[1] != PIXELS or len(x) != len(y) or len(x) == 0:
            raise UserError(f"data file {folder / name} is corrupt: data {x.shape}, labels {y.shape}")
        xs.append(x)
        ys.append(y)
    return np.concatenate(xs), np.concatenate(ys)


def _binary_split(folder: Path, files: list[str], label_bytes: int, label_at: int) -> tuple[np.ndarray, np.ndarray]:
    record = label_bytes + PIXELS
    xs, ys = [], []
    for name in files:
        raw = np.fromfile(folder / name, dtype=np.uint8)
        if raw.size == 0 or raw.size % record:
            raise UserError(
                f"data file {folder / name} is truncated or corrupt: {raw.size} bytes is not a whole "
                f"number of {record}-byte records"
            )
        rows = raw.reshape(-1, record)
        xs.append(rows[:, label_bytes:])
        ys.append(rows[:, label_at].astype(np.int64))
    return np.concatenate(xs), np.concatenate(ys)


def find_cifar(root: Path, name: str) -> tuple[str, Path] | None:
    """('binary' or 'python', folder) of a complete distribution under root (or root itself), else None."""
    for kind, (sub, train, test) in zip(("binary", "python"), LAYOUTS[name]):
        for folder in (root / sub, root):
            if all((folder / f).is_file() for f in train + test):
                return kind, folder
    return None


def read_cifar(name: str, kind: str, folder: Path, labels: str) -> dict[str, np.ndarray]:
    """{train_x, train_y, test_x, test_y}; images (N, 3, 32, 32) uint8. labels: fine or coarse (CIFAR-100)."""
    (_, train_b, test_b), (_, train_p, test_p) = LAYOUTS[name]
    if kind == "binary":
        label_bytes = 1 if name == "cifar10" else 2
        label_at = 0 if name == "cifar10" or labels == "coarse" else 1
        train = _binary_split(folder, train_b, label_bytes, label_at)
        test = _binary_split(folder, test_b, label_bytes, label_at)
    else:
        key = "labels" if name == "cifar10" else f"{labels}_labels"
        train, test = _python_split(folder, train_p, key), _python_split(folder, test_p, key)
    n_classes = {"cifar10": 10, "fine": 100, "coarse": 20}["cifar10" if name == "cifar10" else labels]
    for split, (_, y) in (("train", train), ("test", test)):
        if y.min() < 0 or y.max() >= n_classes:
            raise UserError(f"{name} {split} labels in {folder} lie outside 0..{n_classes - 1}")
    return {
        "train_x": train[0].reshape(-1, 3, 32, 32),
        "train_y": train[1],
        "test_x": test[0].reshape(-1, 3, 32, 32),
        "test_y": test[1],
        "n_classes": n_classes,
    }
