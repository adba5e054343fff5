"""Classic D-PSGD (Lian et al. 2017, Algorithm 1): each round every peer takes a stochastic gradient
at its current weights, averages weights with its neighbours, then applies the gradient step to the
average: x_i <- sum_j W_ij x_j - lr * g_i(x_i). One SGD step per gossip round."""
import torch

from p2pfl.algorithms.base import Algorithm, neighbour_average
from p2pfl.seeding import peer_keys
from p2pfl.training import apply_step, gradients, sample_batch


class DPSGD(Algorithm):
    name = "dpsgd"
    summary = "D-PSGD (Lian et al. 2017): one SGD step per gossip round"
    training = {"lr": 0.1, "batch_size": 10, "momentum": 0.0}

    def round(self, round_index: int) -> torch.Tensor:
        ctx = self.ctx
        opt = ctx.sgd()
        index, mask = sample_batch(ctx.local_shards, opt.batch_size, ctx.cfg.seed, round_index, ctx.peers, ctx.device)
        noise = ctx.stack.dropout_noise(peer_keys(ctx.cfg.seed, "dropout", round_index, ctx.peers, ctx.device),
                                        opt.batch_size) if ctx.stack.dropouts else None
        grad, losses = gradients(ctx.stack, ctx.flat, ctx.data.train_x[index], ctx.data.train_y[index], mask, noise)
        ctx.flat = neighbour_average(ctx, round_index, ctx.flat)
        stepping = mask.sum(1) > 0
        offline = ctx.offline_rows(round_index)
        stepping[offline] = False
        losses[offline] = float("nan")
        apply_step(ctx.flat, grad, stepping, opt, ctx.lr(round_index), None)
        return losses
