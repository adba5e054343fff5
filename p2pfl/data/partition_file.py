"""A partition read from a file instead of drawn: to run on exactly the split another code base used.

The NTK-FL and NTK-DFL reference codes ship theirs as pickled dicts {user id: int64 index array} into
the training set in its published order (`--partition-file user_dataidx_map_0.10_0.dat`). Also read:
.json ({"0": [indices], ...} or a list of lists) and .npz (one array per peer, named by its number).
Pickles are read as plain data (p2pfl.data.plain_pickle), so a file cannot run code. As the reference
code, a run of P peers takes the file's peers 0..P-1.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from p2pfl.data.plain_pickle import PlainUnpickler, integers
from p2pfl.errors import UserError


def _peer_key(key) -> int:
    try:
        return int(key)
    except (TypeError, ValueError):
        raise UserError(f"--partition-file: peer {key!r} is not a number") from None


def _read(path: Path) -> dict[int, object]:
    if path.suffix == ".json":
        raw = json.loads(path.read_text())
        raw = dict(enumerate(raw)) if isinstance(raw, list) else raw
    elif path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as arrays:
            raw = {name: arrays[name] for name in arrays.files}
    else:
        with path.open("rb") as f:
            raw = PlainUnpickler(f).load()
    if not isinstance(raw, dict):
        raise UserError(
            f"--partition-file {path}: expected a map from peer to training indices, got {type(raw).__name__}"
        )
    return {_peer_key(k): v for k, v in raw.items()}


def through_origin(shards: list[np.ndarray], origin: np.ndarray | None, path: str) -> list[np.ndarray]:
    """Indices into the training set as loaded, mapped to the samples kept (Dataset.train_origin): FedAvg-FT
    keeps its held-out classes out of training, and the file's indices must still name the same images."""
    if origin is None:
        return shards
    out = []
    for p, index in enumerate(shards):
        at = np.searchsorted(origin, index)
        dropped = (at >= len(origin)) | (origin[np.minimum(at, len(origin) - 1)] != index)
        if dropped.any():
            raise UserError(
                f"--partition-file {path}: peer {p} has training sample {int(index[dropped][0])}, which "
                "this run keeps out of training (a held-out class)"
            )
        out.append(at.astype(np.int64))
    return out


def read_partition_file(path: str, peers: int, n_train: int, origin: np.ndarray | None = None) -> list[np.ndarray]:
    """Peers 0..peers-1's sorted index arrays from the file, each checked against the training set as
    loaded (n_train samples) and mapped to the samples kept (origin: Dataset.train_origin, see
    through_origin)."""
    file = Path(path)
    try:
        shards = _read(file)
    except UserError:
        raise
    except Exception as e:  # a damaged file fails in many ways (JSON, zip, pickle opcodes); all are one line
        raise UserError(f"--partition-file {path}: cannot be read as .json, .npz or a pickled dict ({e})") from None
    missing = [p for p in range(peers) if p not in shards]
    if missing:
        raise UserError(
            f"--partition-file {path} holds {len(shards)} peers; peer {missing[0]} of the run's "
            f"{peers} is not among them"
        )
    out = []
    for p in range(peers):
        index = integers(shards[p])
        if index is None or index.size == 0:
            raise UserError(f"--partition-file {path}: peer {p} needs a non-empty list of integer indices")
        outside = index[(index < 0) | (index >= n_train)]
        if outside.size:
            raise UserError(
                f"--partition-file {path}: peer {p} has index {int(outside[0])}, outside the {n_train} training samples"
            )
        out.append(np.sort(index.astype(np.int64)))
    return through_origin(out, origin, path)
