"""FEMNIST from LEAF's JSON files: {"users": [...], "user_data": {user: {"x": [[784 floats]], "y": [...]}}},
several files per split. Each writer's training samples are one natural client (--partition writers)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from p2pfl.errors import UserError

N_CLASSES = 62


def find_leaf(root: Path) -> Path | None:
    """The folder holding train/ and test/ with JSON files (root, root/femnist, root/femnist/data)."""
    for folder in (root, root / "femnist", root / "femnist" / "data", root / "data"):
        if all((folder / split).is_dir() and any((folder / split).glob("*.json")) for split in ("train", "test")):
            return folder
    return None


def _read_split(folder: Path) -> tuple[list[str], list[np.ndarray], list[np.ndarray]]:
    users, xs, ys = [], [], []
    for path in sorted(folder.glob("*.json")):
        if path.is_symlink() and not path.exists():
            raise UserError(f"data file {path} is a link to nothing")
        if path.is_dir():
            raise UserError(f"data file {path} is a folder, not a LEAF JSON file")
        try:
            blob = json.loads(path.read_text())
            for user in blob["users"]:
                data = blob["user_data"][user]
                x = np.asarray(data["x"], dtype=np.float32)
                y = np.asarray(data["y"], dtype=np.int64)
                if x.ndim != 2 or x.shape[1] != 784 or len(x) != len(y):
                    raise ValueError(f"writer {user}: x {x.shape}, y {y.shape}")
                if not np.isfinite(x).all():
                    raise UserError(f"data file {path}: writer {user} has NaN or infinite pixels")
                users.append(str(user))
                xs.append(x)
                ys.append(y)
        except OSError as exc:
            raise UserError(f"data file {path} cannot be read ({exc.strerror or exc.__class__.__name__})")
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise UserError(
                f"data file {path} is not a LEAF FEMNIST file or is truncated ({exc.__class__.__name__}: "
                f"{str(exc)[:80]})"
            )
    return users, xs, ys


def read_leaf(folder: Path) -> dict:
    """Train and test arrays with each training sample's writer index (writers in sorted id order)."""
    users, xs, ys = _read_split(folder / "train")
    _, test_x, test_y = _read_split(folder / "test")
    if not users or not test_x:
        raise UserError(f"FEMNIST JSON files in {folder} hold no writers")
    order = sorted(range(len(users)), key=lambda i: users[i])
    groups = np.concatenate([np.full(len(ys[i]), rank) for rank, i in enumerate(order)])
    train_y, test_y_all = np.concatenate([ys[i] for i in order]), np.concatenate(test_y)
    for split, y in (("train", train_y), ("test", test_y_all)):
        if y.min() < 0 or y.max() >= N_CLASSES:
            raise UserError(f"FEMNIST {split} labels in {folder} lie outside 0..{N_CLASSES - 1}")
    return {
        "train_x": np.concatenate([xs[i] for i in order]).reshape(-1, 1, 28, 28),
        "train_y": train_y,
        "test_x": np.concatenate(test_x).reshape(-1, 1, 28, 28),
        "test_y": test_y_all,
        "groups": groups,
        "n_classes": N_CLASSES,
    }
