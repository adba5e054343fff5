"""What a loaded dataset is (Dataset: tensors, classes, task, how to change it before a run) and what a
loader is asked for (DataRequest)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from p2pfl.errors import UserError
from p2pfl.seeding import numpy_rng

CLASS_NAMES = {  # the datasets' own names for their classes, in label order
    "fashion-mnist": (
        "T-shirt/top",
        "Trouser",
        "Pullover",
        "Dress",
        "Coat",
        "Sandal",
        "Shirt",
        "Sneaker",
        "Bag",
        "Ankle boot",
    ),
    "cifar10": ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"),
}


@dataclass
class Dataset:
    name: str
    train_x: torch.Tensor  # (N, *input_shape) float32, normalised
    train_y: torch.Tensor  # (N,) int64 classes, or float32 regression targets
    test_x: torch.Tensor
    test_y: torch.Tensor
    n_classes: int  # outputs of the model: classes, or 1 for regression
    task: str = "classification"
    groups: np.ndarray | None = None  # each training sample's natural owner (writer, client), if any
    truth: dict | None = None  # a generated task's ground truth (linear-rep: B* and each client's w*)
    held_out: dict | None = None  # classes kept out of training for new clients (FedAvg-FT): x, y, test_x, test_y
    # (alpha, beta) where every input is alpha k + beta for 8-bit pixel levels k (one channel): NTK products
    # then run in exact integer arithmetic (p2pfl.ntk.pixels); None where the inputs are not such
    pixel_levels: tuple[float, float] | None = None
    # each training sample's position in the set as loaded, once samples were dropped (None: none were):
    # what a partition file's indices, written against the whole set, are mapped through
    train_origin: np.ndarray | None = None

    @property
    def class_names(self) -> tuple[str, ...] | None:
        """The dataset's names for its classes, where it has them (else figures show the labels)."""
        names = CLASS_NAMES.get(self.name)
        return names if names is not None and len(names) == self.n_classes else None

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.train_x.shape[1:])

    @property
    def train_classes(self) -> int:
        """Classes the training set may hold: all but those held out for new clients (the last ones)."""
        return self.n_classes - (len(self.held_out["classes"]) if self.held_out else 0)

    def to(self, device: torch.device) -> None:
        """Every tensor of the dataset onto the run's device, once: training and test sets, the ground
        truth of a generated task and the held-out classes, so that no step copies samples."""
        self.train_x, self.train_y = self.train_x.to(device), self.train_y.to(device)
        self.test_x, self.test_y = self.test_x.to(device), self.test_y.to(device)
        for extra in (self.truth, self.held_out):
            for key, value in (extra or {}).items():
                if isinstance(value, torch.Tensor):
                    extra[key] = value.to(device)

    def keep_training_samples(self, count: int, seed: int) -> None:
        """A seeded random subset of `count` training samples, in their original order."""
        if count > len(self.train_y):
            raise UserError(f"--train-samples {count} exceeds the {len(self.train_y)} training samples of {self.name}")
        self.select_training(np.sort(numpy_rng(seed, "train-samples").choice(len(self.train_y), count, replace=False)))

    def select_training(self, keep) -> None:
        """Keep these training samples (a boolean mask or sorted positions), in order."""
        keep = np.asarray(keep)
        if keep.dtype == bool:
            keep = np.flatnonzero(keep)
        origin = np.arange(len(self.train_y)) if self.train_origin is None else self.train_origin
        self.train_x, self.train_y = self.train_x[keep], self.train_y[keep]
        self.train_origin = origin[keep]
        if self.groups is not None:
            self.groups = self.groups[keep]


@dataclass(frozen=True)
class DataRequest:
    """What a loader may need besides a folder: generated sets depend on the run's peers and seed."""

    data_dir: str | None = None
    labels: str = "fine"  # CIFAR-100: fine (100) or coarse (20 superclasses)
    peers: int = 10
    samples_per_peer: int = 200
    seed: int = 0
