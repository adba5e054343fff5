"""A model of your own: any function of (input_shape, n_classes) that returns a torch.nn.Module.

python -m p2pfl.run --model tiny_net:make_net --dataset fashion-mnist   # PYTHONPATH=examples
"""

import math

from torch import nn


def make_net(input_shape, n_classes):
    """Two small convolutions for images (C, H, W); a two-layer MLP for flat features."""
    if len(input_shape) == 3:
        channels = input_shape[0]
        return nn.Sequential(
            nn.Conv2d(channels, 8, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
            nn.Flatten(),
            nn.Linear(16 * 16, n_classes),
        )
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), 32), nn.ReLU(), nn.Linear(32, n_classes))
