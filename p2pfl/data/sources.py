"""Datasets by name: where their files are found, how they are read and normalised.

Roots are tried in order: --data-dir, $P2PFL_DATA, the Debian package location (Fashion-MNIST),
then torchvision's downloader where one exists and a network does (never when $P2PFL_NO_DOWNLOAD is
set). Images are kept as (C, H, W); models that want vectors flatten them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from p2pfl.data.cifar import find_cifar, read_cifar
from p2pfl.data.dataset import DataRequest, Dataset
from p2pfl.data.idx import read_idx
from p2pfl.data.leaf import find_leaf, read_leaf
from p2pfl.errors import UserError
from p2pfl.plugins import call_plugin, is_reference, load_object
from p2pfl.seeding import torch_generator

DEBIAN_DIRS = {"fashion-mnist": "/usr/share/datasets/fashion-mnist"}
TORCHVISION_NAMES = {"fashion-mnist": "FashionMNIST", "mnist": "MNIST", "cifar10": "CIFAR10", "cifar100": "CIFAR100"}
NORMALISATION = {  # per-channel mean and std of the training images (the reference codes' values)
    "fashion-mnist": ((0.2860,), (0.3530,)),
    "mnist": ((0.1307,), (0.3081,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
IDX_FILES = {
    "train_x": "train-images-idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte",
    "test_y": "t10k-labels-idx1-ubyte",
}


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


def _locate(name: str, data_dir: str | None, find: Callable[[Path], object | None], files: str):
    """find(root) over the roots in order, then the download cache (filled by torchvision's downloader)."""
    if data_dir is not None:
        found = find(Path(data_dir))
        if found is None:
            raise UserError(f"{name} files ({files}) not found in --data-dir {data_dir}")
        return found
    roots = [Path(os.environ["P2PFL_DATA"])] if os.environ.get("P2PFL_DATA") else []
    roots += [Path(DEBIAN_DIRS[name])] if name in DEBIAN_DIRS else []
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "p2pfl"
    for root in [*roots, cache]:
        found = find(root)
        if found is not None:
            return found
    hint = f"{name} not found; pass --data-dir or set $P2PFL_DATA to a folder with {files}" + (
        " (or apt-get install dataset-fashion-mnist)" if name == "fashion-mnist" else ""
    )
    if name not in TORCHVISION_NAMES or os.environ.get("P2PFL_NO_DOWNLOAD"):
        raise UserError(hint)
    try:
        import torchvision.datasets as tvd

        for train in (True, False):
            getattr(tvd, TORCHVISION_NAMES[name])(str(cache), train=train, download=True)
    except Exception as exc:  # no network: say what to do instead
        raise UserError(f"{hint}; download failed ({exc.__class__.__name__})")
    found = find(cache)
    if found is None:
        raise UserError(hint)
    return found


def _images(a: np.ndarray, name: str) -> torch.Tensor:
    """Pixels / 255, standardised per channel; converted by torch and scaled in place (the same float32
    operations as numpy's astype then new arrays, about a tenth of the time on 70,000 images)."""
    mean, std = (torch.tensor(v).view(-1, 1, 1) for v in NORMALISATION[name])
    return torch.from_numpy(a).to(torch.float32, copy=True).div_(255.0).sub_(mean).div_(std)


def _levels(mean: float, std: float) -> tuple[float, float]:
    """(alpha, beta) of _images' single-channel map k -> (k / 255 - mean) / std, from its float32 constants."""
    mean, std = float(torch.tensor(mean)), float(torch.tensor(std))
    return 1 / (255 * std), -mean / std


def _check_splits(name: str, where, arrays: dict) -> None:
    for split in ("train", "test"):
        x, y = arrays[f"{split}_x"], arrays[f"{split}_y"]
        if len(x) != len(y) or len(x) == 0:
            raise UserError(f"{name} {split} files in {where} disagree: images {x.shape}, labels {y.shape}")
        if 0 in x.shape[1:]:
            raise UserError(f"{name} {split} images in {where} have no pixels: {x.shape}")
    if arrays["train_x"].shape[1:] != arrays["test_x"].shape[1:]:
        raise UserError(
            f"{name} in {where}: test images {arrays['test_x'].shape[1:]} differ from training "
            f"images {arrays['train_x'].shape[1:]}"
        )


def load_idx(name: str, req: DataRequest) -> Dataset:
    folder = _locate(
        name, req.data_dir, lambda root: _idx_folder(root, name), f"{', '.join(IDX_FILES.values())}, gzipped or not"
    )
    arrays = {key: read_idx(_find_file(folder, stem)) for key, stem in IDX_FILES.items()}
    for split in ("train", "test"):
        if arrays[f"{split}_x"].ndim != 3 or arrays[f"{split}_y"].ndim != 1:
            raise UserError(
                f"{name} {split} files in {folder} are not images and labels: "
                f"{arrays[f'{split}_x'].shape}, {arrays[f'{split}_y'].shape}"
            )
    _check_splits(name, folder, arrays)
    labels = [torch.from_numpy(arrays[k].astype(np.int64)) for k in ("train_y", "test_y")]
    n_classes = 10
    if max(int(l.max()) for l in labels) >= n_classes or min(int(l.min()) for l in labels) < 0:
        raise UserError(f"{name} labels in {folder} lie outside 0..9")
    images = [_images(arrays[k][:, None], name) for k in ("train_x", "test_x")]
    (mean,), (std,) = NORMALISATION[name]
    return Dataset(name, images[0], labels[0], images[1], labels[1], n_classes, pixel_levels=_levels(mean, std))


def load_cifar(name: str, req: DataRequest) -> Dataset:
    sub = {
        "cifar10": "cifar-10-batches-bin or cifar-10-batches-py",
        "cifar100": "cifar-100-binary or cifar-100-python",
    }[name]
    kind, folder = _locate(name, req.data_dir, lambda root: find_cifar(root, name), sub)
    arrays = read_cifar(name, kind, folder, req.labels)
    _check_splits(name, folder, arrays)
    return Dataset(
        name,
        _images(arrays["train_x"], name),
        torch.from_numpy(arrays["train_y"]),
        _images(arrays["test_x"], name),
        torch.from_numpy(arrays["test_y"]),
        arrays["n_classes"],
    )


def load_femnist(name: str, req: DataRequest) -> Dataset:
    folder = _locate(name, req.data_dir, find_leaf, "LEAF's train/*.json and test/*.json")
    arrays = read_leaf(folder)
    _check_splits(name, folder, arrays)
    train = torch.from_numpy(arrays["train_x"])
    mean, std = float(train.mean()), float(train.std()) or 1.0  # LEAF gives [0, 1] floats; no published stats
    return Dataset(
        name,
        (train - mean) / std,
        torch.from_numpy(arrays["train_y"]),
        (torch.from_numpy(arrays["test_x"]) - mean) / std,
        torch.from_numpy(arrays["test_y"]),
        arrays["n_classes"],
        groups=arrays["groups"],
    )


def synthetic_dataset(
    name: str = "synthetic",
    req: DataRequest | None = None,
    n_train: int = 6000,
    n_test: int = 1000,
    features: int = 64,
    classes: int = 10,
) -> Dataset:
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


LINEAR_REP_D, LINEAR_REP_K, LINEAR_REP_NOISE, LINEAR_REP_TEST = 100, 5, 0.1, 100


def linear_rep_dataset(name: str, req: DataRequest) -> Dataset:
    """FedAvg-FT section 5.1: client i's samples are y = <B* w*_i, x> + e with x ~ N(0, I_d), a shared
    B* (d = 100, k = 5, orthonormal columns from the QR of a Gaussian matrix), w*_i ~ N(0, I_k) and
    noise e ~ N(0, 0.1^2) (the paper's 'N(0, 0.01)' read as a variance). One client per peer,
    --samples-per-peer training samples each (its natural split: --partition writers); the test set
    holds 100 fresh samples of every client."""
    gen = torch_generator(req.seed, "linear-rep")
    d, k, m = LINEAR_REP_D, LINEAR_REP_K, req.peers
    b_star, _ = torch.linalg.qr(torch.randn(d, k, generator=gen))
    w_star = torch.randn(m, k, generator=gen)

    def draw(per_client: int) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        x = torch.randn(m, per_client, d, generator=gen)
        y = torch.einsum("mnd,dk,mk->mn", x, b_star, w_star) + LINEAR_REP_NOISE * torch.randn(
            m, per_client, generator=gen
        )
        return x.reshape(-1, d), y.reshape(-1), np.repeat(np.arange(m), per_client)

    train_x, train_y, groups = draw(req.samples_per_peer)
    test_x, test_y, _ = draw(LINEAR_REP_TEST)
    return Dataset(
        name,
        train_x,
        train_y,
        test_x,
        test_y,
        1,
        task="regression",
        groups=groups,
        truth={"B": b_star, "w": w_star, "noise": LINEAR_REP_NOISE},
    )


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    load: Callable[[str, DataRequest], Dataset]
    aliases: tuple[str, ...] = ()
    default_model: str = "mlp"
    default_partition: str = "dirichlet"
    task: str = "classification"
    images: bool = True  # (C, H, W) inputs; False: flat feature vectors
    natural_split: bool = False  # each sample has an owner (--partition writers)
    generated: bool = False  # made in memory, not read from files (--data-dir does not apply)


DATASETS = {
    s.name: s
    for s in [
        DatasetSpec("fashion-mnist", load_idx, ("fmnist", "fashion_mnist", "fashionmnist")),
        DatasetSpec("mnist", load_idx),
        DatasetSpec("cifar10", load_cifar, ("cifar-10", "cifar_10"), "lenet5"),
        DatasetSpec("cifar100", load_cifar, ("cifar-100", "cifar_100"), "resnet8"),
        DatasetSpec("femnist", load_femnist, (), "cnn-femnist", "writers", natural_split=True),
        DatasetSpec("synthetic", synthetic_dataset, images=False, generated=True),
        DatasetSpec(
            "linear-rep", linear_rep_dataset, ("linear_rep",), "linear-rep", "writers", "regression", False, True, True
        ),
    ]
}
ALIASES = {alias: s.name for s in DATASETS.values() for alias in (s.name, *s.aliases)}


def canonical_dataset(name: str) -> str | None:
    """A built-in dataset's own name for one of its aliases; a 'module:function' reference stays as it is."""
    return str(name) if is_reference(name) else ALIASES.get(str(name).lower())


def dataset_spec(name: str) -> DatasetSpec:
    """The spec of a dataset named by canonical_dataset, or of a reference to the user's loader."""
    if is_reference(name):
        load_object(name, "--dataset")  # importable: checked before anything is read
        return DatasetSpec(name, _user_dataset, natural_split=True)
    return DATASETS[name]


def _user_dataset(reference: str, req: DataRequest) -> Dataset:
    """The user's loader called with no arguments: a p2pfl Dataset, or (train_x, train_y, test_x, test_y),
    optionally followed by each training sample's owner (for --partition writers); classes are the
    labels 0..C-1. What it returns is checked here, where it enters: one line naming the field."""
    out = call_plugin(f"--dataset {reference} (loading its data)", load_object(reference, "--dataset"))
    if isinstance(out, Dataset):
        return out
    parts = tuple(out) if isinstance(out, (tuple, list)) else ()
    if len(parts) not in (4, 5):
        raise UserError(
            f"--dataset {reference} must return (train_x, train_y, test_x, test_y[, owners]) or a "
            f"p2pfl Dataset, not {type(out).__name__}"
        )
    where = f"--dataset {reference}"
    train_x, train_y, test_x, test_y = (
        _numbers(v, f"{where}: {name}") for v, name in zip(parts, ("train_x", "train_y", "test_x", "test_y"))
    )
    for x, name in ((train_x, "train_x"), (test_x, "test_x")):
        if x.ndim < 2 or len(x) == 0 or 0 in x.shape[1:]:
            raise UserError(
                f"{where}: {name} has shape {tuple(x.shape)}; it must be (samples, features...) with at "
                "least one sample and one feature"
            )
        if not torch.isfinite(x.float()).all():
            raise UserError(f"{where}: {name} holds NaN or inf")
    if train_x.shape[1:] != test_x.shape[1:]:
        raise UserError(
            f"{where}: test_x's samples are {tuple(test_x.shape[1:])}, train_x's {tuple(train_x.shape[1:])}"
        )
    for y, x, name in ((train_y, train_x, "train_y"), (test_y, test_x, "test_y")):
        if y.ndim != 1 or len(y) != len(x) or y.is_floating_point():
            raise UserError(
                f"{where}: {name} must hold one integer class per sample ({len(x)}), not "
                f"{y.dtype} of shape {tuple(y.shape)}"
            )
    n_classes = int(max(train_y.max(), test_y.max())) + 1
    low = int(min(train_y.min(), test_y.min()))
    present = train_y.unique().tolist()  # sorted; nothing sized by the largest label (2**40 would not fit)
    empty = n_classes - len(present)
    if low < 0 or empty:
        raise UserError(
            f"{where}: labels must be the classes 0..C-1, each with training samples; "
            + (
                f"a label is {low}"
                if low < 0
                else f"they reach {n_classes - 1}, but {empty} of those classes have no training sample "
                f"(such as {next((i for i, c in enumerate(present) if c != i), len(present))})"
            )
        )
    groups = np.asarray(parts[4]) if len(parts) == 5 else None
    if groups is not None and (groups.ndim != 1 or len(groups) != len(train_x)):
        raise UserError(
            f"{where}: owners must name one owner per training sample ({len(train_x)}), not shape {groups.shape}"
        )
    if groups is not None and not (
        np.issubdtype(groups.dtype, np.integer) or np.issubdtype(groups.dtype, np.str_)
    ):  # an owner is a name or a whole number, not 0.5
        raise UserError(f"{where}: owners must be whole numbers or names, not {groups.dtype} values")
    if groups is not None and np.issubdtype(groups.dtype, np.integer) and len(groups) and groups.min() < 0:
        raise UserError(f"{where}: owners are whole numbers >= 0 or names; one is {int(groups.min())}")
    return Dataset(reference, train_x.float(), train_y.long(), test_x.float(), test_y.long(), n_classes, groups=groups)


def _numbers(value, what: str) -> torch.Tensor:
    """A plug-in's array as a tensor of its own: a tensor that requires grad or lives on a GPU, and a numpy
    view with negative strides (x[::-1]) are taken as their values."""
    array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    if array.dtype.kind not in "biuf":
        raise UserError(f"{what} holds {array.dtype} values, not numbers")
    return torch.as_tensor(np.ascontiguousarray(array))


def load_dataset(name: str, req: DataRequest | None = None) -> Dataset:
    canonical = canonical_dataset(name)
    if canonical is None:
        raise UserError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}")
    return dataset_spec(canonical).load(canonical, req or DataRequest())


__all__ = ["DATASETS", "DataRequest", "Dataset", "canonical_dataset", "dataset_spec", "load_dataset"]
