"""Classic D-PSGD (Lian et al. 2017, Algorithm 1): each round every peer takes a stochastic gradient
at its current weights, averages weights with its neighbours, then applies the gradient step to the
average: x_i <- sum_j W_ij x_j - lr * g_i(x_i). One SGD step per gossip round.

With --momentum it is DSGDm, the heavy-ball baseline of Lin et al. (ICML 2021): each peer keeps its own
momentum buffer over the rounds (a checkpoint saves it) and steps buf <- momentum buf + g."""

import torch

from p2pfl.algorithms.base import Round
from p2pfl.algorithms.public_copies import GossipAverager
from p2pfl.local.training import apply_step


class DPSGD(GossipAverager):
    name = "dpsgd"
    summary = "D-PSGD (Lian et al. 2017): one SGD step per gossip round"
    training = {"lr": 0.1, "batch_size": 10, "momentum": 0.0}
    private_training = True

    def __init__(self, ctx, settings=None):
        super().__init__(ctx, settings)
        self.velocity = (
            torch.zeros(len(ctx.peers), ctx.stack.layout.trainable, device=ctx.device) if ctx.cfg.momentum else None
        )

    @property
    def state(self) -> dict[str, str]:
        return {**super().state, "velocity": "peer"} if self.velocity is not None else super().state

    def round(self, round_index: int) -> Round:
        ctx = self.ctx
        opt = ctx.sgd()
        grad, losses, stepping = ctx.stochastic_gradients(round_index, opt)
        self.average(round_index)
        apply_step(ctx.flat, grad, stepping, opt, ctx.lr(round_index), self.velocity)
        return Round(losses)
