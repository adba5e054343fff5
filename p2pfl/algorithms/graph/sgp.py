"""Stochastic Gradient Push (Assran, Loizou, Ballas and Rabbat, ICML 2019, Algorithm 1): SGD over push-sum
gossip, which averages exactly on any strongly connected directed or time-varying graph. Each peer keeps a
numerator x_i and a push-sum weight w_i (starting at its model and 1) and reads its model de-biased,
z_i = x_i / w_i:

    x_i <- x_i - lr g_i(z_i)
    x_i <- sum_j P_ij x_j,   w_i <- sum_j P_ij w_j        P_ij = 1/(outdeg_j + 1): column-stochastic
    z_i  = x_i / w_i

Column sums of 1 keep the sums of x and of w, so z_i goes to the mean even where no doubly stochastic W
exists (a digraph whose peers hear different numbers of others); with W = P row-stochastic instead, D-PSGD
goes to a weighted mean. x_i and w_i travel in one message. The paper's graph is the time-varying one-peer
exponential graph (each peer sends to one peer 2^(k mod log2 n) ahead), on which P = (I + Pi)/2 and w stays
1. --mixing does not apply: push-sum's weights are its own. g is the gradient of the whole objective
(minibatch loss plus --weight-decay) at z_i. ctx.flat holds z (what the metrics score and the run reports).

Compared with the authors' code (facebookresearch/stochastic_gradient_push: gossip/gossiper.py's PushSum,
gossip/mixing_manager.py's UniformMixing): the same split of x and w, 1/(out-peers + 1) each to itself and
its out-peers; theirs can overlap the gossip with the next step (--overlap) and steps with local momentum
(--momentum 0.9 by default); this is the synchronous Algorithm 1 with plain SGD (--momentum is refused).
Under --drop-links a peer renormalises what arrived as D-PSGD does, so the sums are no longer kept exactly.
"""

from __future__ import annotations

import torch

from p2pfl.algorithms.base import Algorithm, Round, neighbour_average, refuse_momentum
from p2pfl.errors import UserError
from topologies import push_sum_weights


class SGP(Algorithm):
    name = "sgp"
    summary = "Stochastic Gradient Push (Assran et al. 2019): push-sum SGD, exact on directed graphs"
    directed_graphs = True  # push-sum's weights are column-stochastic on any digraph
    push_sum = True  # x / w removes the bias of weights that are not doubly stochastic
    mixing = "uniform"  # not used: push-sum's own weights (a run's config.toml names this)
    training = {"lr": 0.1, "batch_size": 10, "momentum": 0.0}
    state = {"numerator": "peer", "push_weight": "peer"}

    @classmethod
    def check(cls, cfg) -> None:
        refuse_momentum(cls, cfg)
        if cfg.mixing not in (None, "uniform"):  # uniform: what a resume's config.toml names
            raise UserError(
                f"--algo sgp mixes with push-sum's own weights (1/(out-degree + 1)); drop --mixing {cfg.mixing}"
            )

    def __init__(self, ctx, settings=None):
        super().__init__(ctx, settings)
        self.numerator = ctx.flat.clone()  # x_i
        self.push_weight = torch.ones(len(ctx.peers), 1, device=ctx.device, dtype=ctx.flat.dtype)  # w_i

    def round(self, round_index: int) -> Round:
        ctx = self.ctx
        grad, losses, stepping = ctx.objective_gradients(round_index)  # at z_i = ctx.flat
        self.numerator[:, : grad.shape[1]] -= ctx.lr(round_index) * grad
        weights = push_sum_weights(ctx.schedule.graph(round_index))
        mixed = neighbour_average(ctx, round_index, torch.cat([self.numerator, self.push_weight], 1), weights=weights)
        self.numerator, self.push_weight = mixed[:, :-1].contiguous(), mixed[:, -1:].contiguous()
        ctx.flat = self.numerator / self.push_weight
        return Round(losses)
