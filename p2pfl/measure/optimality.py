"""How far a run is from a stationary point of the peers' joint objective (--grad-norm): the norm of the
gradient of f(w) = (1/n) sum_i f_i(w) at the peers' mean model, f_i a peer's mean loss over its whole
training shard plus weight_decay/2 ||w||^2. Optimization papers plot it against rounds; a convex problem's
optimum is where it is 0."""

from __future__ import annotations

import torch

from p2pfl.local.gradients import gradients
from p2pfl.local.training import padded_shards
from p2pfl.models import PeerStack

PEER_BLOCK = 1  # one peer at a time: the same shapes, so the same float32 gradient, on any layout of ranks


def objective_gradient_sum(
    stack: PeerStack,
    model: torch.Tensor,
    shards: list[torch.Tensor],
    data: tuple[torch.Tensor, torch.Tensor],
    weight_decay: float,
) -> torch.Tensor:
    """(trainable,) float64: sum over the given peers of grad f_i(model), f_i the peer's mean loss over
    all of its shard (no dropout) plus weight_decay/2 ||w||^2; model (D,) on the data's device. Summed over
    the ranks and divided by the peers, it is the objective's gradient."""
    x, y = data
    weights = model[: stack.layout.trainable].double()
    total = torch.zeros(stack.layout.trainable, dtype=torch.float64, device=model.device)
    for start in range(0, len(shards), PEER_BLOCK):
        block = shards[start : start + PEER_BLOCK]
        lengths = torch.tensor([len(s) for s in block])
        index = padded_shards(block, max(1, int(lengths.max())), model.device)
        mask = (torch.arange(index.shape[1])[None] < lengths[:, None]).to(model.device, model.dtype)
        rows = model[None].repeat(len(block), 1)  # a copy each: batch norm's statistics are written into it
        grad, _ = gradients(stack, rows, x[index], y[index], mask)
        total += grad.double().sum(0) + weight_decay * len(block) * weights
    return total
