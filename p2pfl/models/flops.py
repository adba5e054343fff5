"""A model's floating-point operations for one minibatch step, which can set the virtual clock's step time
(--peer-flops: a peer's device speed)."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


def step_flops(model: nn.Module, input_shape: tuple[int, ...], batch: int) -> int:
    """The FLOPs of one minibatch's forward and backward pass, as torch's FlopCounterMode counts them (matrix
    products and convolutions), on the meta device: nothing is computed or allocated."""
    meta = copy.deepcopy(model).to("meta")
    x = torch.zeros((batch, *input_shape), device="meta")
    with FlopCounterMode(display=False) as counter:
        meta(x).sum().backward()
    return int(counter.get_total_flops())
