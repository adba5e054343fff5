"""Quasi-global momentum (QG-DSGDm: Lin, Karimireddy, Stich and Jaggi, ICML 2021, Algorithm 1). Local
momentum (DSGDm) follows each peer's own gradients and, on heterogeneous data, drifts; QG-DSGDm builds its
momentum buffer from how far the peer's model actually moved over a round, gossip included, which
approximates the global direction:

    m_i   = beta m^_i + g_i(x_i)                       the step's momentum (Nesterov: g_i + beta m_i)
    x_i'  = sum_j W_ij (x_j - lr step_j)               D-PSGD's step and averaging
    d_i   = (x_i - x_i') / lr                           the round's whole move, as a gradient
    m^_i  <- mu m^_i + (1 - mu) d_i                      the quasi-global buffer, kept between rounds

g is the gradient of the whole objective (minibatch loss plus --weight-decay); beta is --momentum (0.9),
mu is --qg-mu (0.9). Defaults from the authors' code and commands (epfml/quasi-global-momentum,
pcode/optim/decentralized_qg_sgd.py; code/README.md runs it with --use_nesterov True --momentum_factor 0.9,
and its buffer factor defaults to 0.1 = 1 - mu). Offline peers (--drop-peers) keep their buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from p2pfl.algorithms.base import Algorithm, Round, neighbour_average
from p2pfl.settings.fields import option, probability


@dataclass(frozen=True)
class QGSettings:
    qg_mu: float = option(0.9, "QG-DSGDm: how slowly the quasi-global momentum buffer forgets (mu)", probability)
    qg_nesterov: bool = option(True, "QG-DSGDm: Nesterov's form of the momentum step (the authors' runs)")


class QGDSGDm(Algorithm):
    name = "qg-dsgdm"
    summary = "quasi-global momentum (Lin et al. 2021): momentum from each round's whole move"
    directed_graphs = True  # averaging reads in-neighbours; W must keep the mean (doubly stochastic)
    Settings = QGSettings
    training = {"lr": 0.1, "batch_size": 10, "momentum": 0.9}
    state = {"buffer": "peer"}

    def __init__(self, ctx, settings=None):
        super().__init__(ctx, settings)
        self.buffer = torch.zeros(len(ctx.peers), ctx.stack.layout.trainable, device=ctx.device)  # m^_i

    def round(self, round_index: int) -> Round:
        ctx, beta, mu = self.ctx, self.ctx.cfg.momentum, self.settings.qg_mu
        grad, losses, stepping = ctx.objective_gradients(round_index)
        lr, trainable = ctx.lr(round_index), grad.shape[1]
        momentum = beta * self.buffer + grad
        step = grad + beta * momentum if self.settings.qg_nesterov else momentum
        before = ctx.flat[:, :trainable]  # the rows before averaging: neighbour_average returns new ones
        sent = ctx.flat.clone()
        sent[:, :trainable] -= lr * step * stepping[:, None]
        ctx.flat = neighbour_average(ctx, round_index, sent)
        moved = (before - ctx.flat[:, :trainable]) / lr
        self.buffer = torch.where(stepping[:, None], mu * self.buffer + (1 - mu) * moved, self.buffer)
        return Round(losses)
