"""Classic D-PSGD (Lian et al. 2017, Algorithm 1): each round every peer takes a stochastic gradient
at its current weights, averages weights with its neighbours, then applies the gradient step to the
average: x_i <- sum_j W_ij x_j - lr * g_i(x_i). One SGD step per gossip round.

With --momentum it is DSGDm, the heavy-ball baseline of Lin et al. (ICML 2021): each peer keeps its own
momentum buffer over the rounds (a checkpoint saves it) and steps buf <- momentum buf + g."""

import torch

from p2pfl.algorithms.base import Algorithm, Round, neighbour_average
from p2pfl.algorithms.public_copies import average_over_copies, starting_copies
from p2pfl.gossip.codec_settings import GossipSettings, gossip_codec
from p2pfl.local.training import apply_step


class DPSGD(Algorithm):
    name = "dpsgd"
    summary = "D-PSGD (Lian et al. 2017): one SGD step per gossip round"
    directed_graphs = True  # averaging reads in-neighbours only
    Settings = GossipSettings
    training = {"lr": 0.1, "batch_size": 10, "momentum": 0.0}

    @classmethod
    def check(cls, cfg) -> None:
        gossip_codec(cfg.settings)

    def __init__(self, ctx, settings=None):
        super().__init__(ctx, settings)
        codec = gossip_codec(self.settings)  # built once; None: dense
        self.copies = starting_copies(ctx, codec) if codec is not None else None
        self.velocity = (
            torch.zeros(len(ctx.peers), ctx.stack.layout.trainable, device=ctx.device) if ctx.cfg.momentum else None
        )

    @classmethod
    def needs_static_graph(cls, settings) -> bool:
        return gossip_codec(settings) is not None  # the public copies sum one set of neighbours

    @property
    def state(self) -> dict[str, str]:
        copies = {"copies.estimate": "peer", "copies.mixed": "peer"} if self.copies is not None else {}
        return {**copies, "velocity": "peer"} if self.velocity is not None else copies

    def round(self, round_index: int) -> Round:
        ctx = self.ctx
        opt = ctx.sgd()
        grad, losses, stepping = ctx.stochastic_gradients(round_index, opt)
        if self.copies is None:
            ctx.flat = neighbour_average(ctx, round_index, ctx.flat)
        else:  # the compressed change since each peer's public copy (p2pfl.algorithms.public_copies)
            ctx.flat = average_over_copies(ctx, round_index, ctx.flat, self.copies)
        apply_step(ctx.flat, grad, stepping, opt, ctx.lr(round_index), self.velocity)
        return Round(losses)
