"""CIFAR-style ResNets (3x3 stem, no max-pool): ResNet-18 (TCT: 4 stages of 2 basic blocks, 64-512
channels) and ResNet-8 (CyclicFL: 3 basic blocks, 16-64 channels), with batch or group norm."""

from __future__ import annotations

from torch import nn
from torch.nn import functional as F

from p2pfl.models.layers import norm_layer


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int, norm: str):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.norm1 = norm_layer(norm, c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.norm2 = norm_layer(norm, c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), norm_layer(norm, c_out))

    def forward(self, x):
        out = F.relu(self.norm1(self.conv1(x)))
        return F.relu(self.norm2(self.conv2(out)) + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, input_shape, n_classes, stages: list[tuple[int, int, int]], stem: int, norm: str):
        """stages: (channels, blocks, stride) per stage."""
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(input_shape[0], stem, 3, 1, 1, bias=False), norm_layer(norm, stem), nn.ReLU()
        )
        blocks, c_in = [], stem
        for channels, count, stride in stages:
            for i in range(count):
                blocks.append(BasicBlock(c_in, channels, stride if i == 0 else 1, norm))
                c_in = channels
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(c_in, n_classes)

    def forward(self, x):
        out = self.blocks(self.stem(x))
        return self.head(F.adaptive_avg_pool2d(out, 1).flatten(1))


def resnet18(input_shape, n_classes, norm: str = "batch") -> ResNet:
    return ResNet(input_shape, n_classes, [(64, 2, 1), (128, 2, 2), (256, 2, 2), (512, 2, 2)], 64, norm)


def resnet8(input_shape, n_classes, norm: str = "batch") -> ResNet:
    return ResNet(input_shape, n_classes, [(16, 1, 1), (32, 1, 2), (64, 1, 2)], 16, norm)
