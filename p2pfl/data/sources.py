"""Datasets by name: where their files are found, how they are read and normalised.

Roots are tried in order: --data-dir, $P2PFL_DATA, the Debian package location (Fashion-MNIST),
then torchvision's downloader where a network exists (never when $P2PFL_NO_DOWNLOAD is set).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from p2pfl.data.idx import read_idx
from p2pfl.errors import UserError

DEBIAN_DIRS = {"fashion-mnist": "/usr/share/datasets/fashion-mnist"}
TORCHVISION_NAMES = {"fashion-mnist": "FashionMNIST", "mnist": "MNIST"}
NORMALISATION = {"fashion-mnist": (0.2860, 0.3530), "mnist": (0.1307, 0.3081)}  # reference code's values
IDX_FILES = {"train_x": "train-images-idx3-ubyte", "train_y": "train-labels-idx1-ubyte",
             "test_x": "t10k-images-idx3-ubyte", "test_y": "t10k-labels-idx1-ubyte"}


@dataclass
class Dataset:
    name: str
    train_x: torch.Tensor  # (N, features) float32, normalised
    train_y: torch.Tensor  # (N,) int64
    test_x: torch.Tensor
    test_y: torch.Tensor
    n_classes: int

    @property
    def n_features(self) -> int:
        return self.train_x.shape[1]


def _find_file(folder: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (folder / name).is_file():
            return folder / name
    return None


def _idx_folder(root: Path, name: str) -> Path | None:
    """A folder under root holding all four IDX files (flat, <name>/, or torchvision's <Name>/raw/)."""
    for folder in (root, root / name, root / TORCHVISION_NAMES[name] / "raw"):
        if all(_find_file(folder, stem) for stem in IDX_FILES.values()):
            return folder
    return None


def _roots(name: str) -> list[Path]:
    roots = []
    if os.environ.get("P2PFL_DATA"):
        roots.append(Path(os.environ["P2PFL_DATA"]))
    if name in DEBIAN_DIRS:
        roots.append(Path(DEBIAN_DIRS[name]))
    return roots


def locate_idx(name: str, data_dir: str | None) -> Path:
    if data_dir is not None:
        folder = _idx_folder(Path(data_dir), name)
        if folder is None:
            raise UserError(f"{name} IDX files ({', '.join(IDX_FILES.values())}, gzipped or not) "
                            f"not found in --data-dir {data_dir}")
        return folder
    for root in _roots(name):
        folder = _idx_folder(root, name)
        if folder is not None:
            return folder
    return _download(name)


def _download(name: str) -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "p2pfl"
    folder = _idx_folder(cache, name)
    if folder is not None:
        return folder
    hint = f"{name} not found; pass --data-dir or set $P2PFL_DATA" + (
        " (or apt-get install dataset-fashion-mnist)" if name == "fashion-mnist" else "")
    if os.environ.get("P2PFL_NO_DOWNLOAD"):
        raise UserError(hint)
    try:
        import torchvision.datasets as tvd

        getattr(tvd, TORCHVISION_NAMES[name])(str(cache), train=True, download=True)
        getattr(tvd, TORCHVISION_NAMES[name])(str(cache), train=False, download=True)
    except Exception as exc:  # no network: say what to do instead
        raise UserError(f"{hint}; download failed ({exc.__class__.__name__})")
    folder = _idx_folder(cache, name)
    if folder is None:
        raise UserError(hint)
    return folder


def load_idx_dataset(name: str, data_dir: str | None) -> Dataset:
    folder = locate_idx(name, data_dir)
    arrays = {key: read_idx(_find_file(folder, stem)) for key, stem in IDX_FILES.items()}
    for split in ("train", "test"):
        x, y = arrays[f"{split}_x"], arrays[f"{split}_y"]
        if x.ndim != 3 or y.ndim != 1 or len(x) != len(y):
            raise UserError(f"{name} {split} files in {folder} disagree: images {x.shape}, labels {y.shape}")
    mean, std = NORMALISATION[name]

    def images(a: np.ndarray) -> torch.Tensor:
        return ((torch.from_numpy(a.reshape(len(a), -1).astype(np.float32)) / 255.0) - mean) / std

    labels = [torch.from_numpy(arrays[k].astype(np.int64)) for k in ("train_y", "test_y")]
    n_classes = int(max(int(l.max()) for l in labels)) + 1
    return Dataset(name, images(arrays["train_x"]), labels[0], images(arrays["test_x"]), labels[1], n_classes)


def synthetic_dataset(n_train: int = 6000, n_test: int = 1000, features: int = 64, classes: int = 10) -> Dataset:
    """Gaussian class clusters: learnable in a few steps, for fast tests. Always the same data."""
    gen = torch.Generator().manual_seed(1234)
    means = torch.randn(classes, features, generator=gen) * 0.6

    def draw(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.arange(n) % classes
        y = y[torch.randperm(n, generator=gen)]
        return means[y] + torch.randn(n, features, generator=gen), y

    train_x, train_y = draw(n_train)
    test_x, test_y = draw(n_test)
    return Dataset("synthetic", train_x, train_y, test_x, test_y, classes)


def load_dataset(name: str, data_dir: str | None = None) -> Dataset:
    if name == "synthetic":
        return synthetic_dataset()
    if name in TORCHVISION_NAMES:
        return load_idx_dataset(name, data_dir)
    raise UserError(f"unknown dataset {name!r}")
