"""Convolutional networks of the TCT, CyclicFL and FedAvg-FT papers. Inputs are (C, H, W) images;
the first fully connected layer's width is found by running one dummy image through the trunk, so
every net fits 28x28 (MNIST-like) and 32x32 (CIFAR) inputs alike."""

from __future__ import annotations

import torch
from torch import nn

from p2pfl.models.layers import PeerDropout


def _flat_size(trunk: nn.Module, input_shape: tuple[int, ...]) -> int:
    with torch.no_grad():
        return int(trunk(torch.zeros(1, *input_shape)).numel())


def conv_pool(c_in: int, c_out: int, k: int, pad: int = 0) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_out, k, padding=pad), nn.ReLU(), nn.MaxPool2d(2)]


class SimpleCNN(nn.Module):
    """TCT's FMNIST net: two conv + max-pool layers, two fully connected. The paper gives no widths; we
    take conv 5x5 16 and 32 channels and a 256-wide hidden layer: 147,146 parameters on 28x28x1, above
    TCT's p = 100,000 coordinates, so its eNTK subsampling is not vacuous."""

    def __init__(self, input_shape, n_classes):
        super().__init__()
        self.trunk = nn.Sequential(*conv_pool(input_shape[0], 16, 5), *conv_pool(16, 32, 5), nn.Flatten())
        flat = _flat_size(self.trunk, input_shape)
        self.head = nn.Sequential(nn.Linear(flat, 256), nn.ReLU(), nn.Linear(256, n_classes))

    def forward(self, x):
        return self.head(self.trunk(x))


class CNNFashionMNIST(nn.Module):
    """CyclicFL's CNN-FMNIST: 2 conv + dropout + 2 FC (widths not given: conv 5x5 32 and 64 channels,
    dropout 0.5 before a 512-wide hidden layer)."""

    def __init__(self, input_shape, n_classes):
        super().__init__()
        self.trunk = nn.Sequential(*conv_pool(input_shape[0], 32, 5), *conv_pool(32, 64, 5), nn.Flatten())
        flat = _flat_size(self.trunk, input_shape)
        self.head = nn.Sequential(PeerDropout(0.5, flat), nn.Linear(flat, 512), nn.ReLU(), nn.Linear(512, n_classes))

    def forward(self, x):
        return self.head(self.trunk(x))


class CNNFEMNIST(nn.Module):
    """CyclicFL's CNN-FEMNIST: 2 conv + 1 FC (the LEAF net's 5x5 32 and 64 channels, 'same' padding)."""

    def __init__(self, input_shape, n_classes):
        super().__init__()
        self.trunk = nn.Sequential(*conv_pool(input_shape[0], 32, 5, 2), *conv_pool(32, 64, 5, 2), nn.Flatten())
        self.head = nn.Linear(_flat_size(self.trunk, input_shape), n_classes)

    def forward(self, x):
        return self.head(self.trunk(x))


class LeNet5(nn.Module):
    """LeNet-5: conv 5x5 6 and 16 channels with max-pool, then 120-84-classes."""

    def __init__(self, input_shape, n_classes):
        super().__init__()
        self.trunk = nn.Sequential(*conv_pool(input_shape[0], 6, 5), *conv_pool(6, 16, 5), nn.Flatten())
        flat = _flat_size(self.trunk, input_shape)
        self.head = nn.Sequential(
            nn.Linear(flat, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, n_classes)
        )

    def forward(self, x):
        return self.head(self.trunk(x))


class CNNCifar(nn.Module):
    """FedAvg-FT's CNN: three blocks of conv-conv-maxpool (3x3, 32/64/128 channels; widths not given in the
    paper) and a 3-layer MLP (256-128-classes)."""

    def __init__(self, input_shape, n_classes):
        super().__init__()
        layers: list[nn.Module] = []
        c_in = input_shape[0]
        for c in (32, 64, 128):
            layers += [
                nn.Conv2d(c_in, c, 3, padding=1),
                nn.ReLU(),
                nn.Conv2d(c, c, 3, padding=1),
                nn.ReLU(),
                nn.MaxPool2d(2),
            ]
            c_in = c
        self.trunk = nn.Sequential(*layers, nn.Flatten())
        flat = _flat_size(self.trunk, input_shape)
        self.head = nn.Sequential(
            nn.Linear(flat, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, n_classes)
        )

    def forward(self, x):
        return self.head(self.trunk(x))
