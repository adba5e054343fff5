"""Classic D-PSGD (Lian et al. 2017, Algorithm 1): each round every peer takes a stochastic gradient
at its current weights, averages weights with its neighbours, then applies the gradient step to the
average: x_i <- sum_j W_ij x_j - lr * g_i(x_i). One SGD step per gossip round."""

from p2pfl.algorithms.base import Algorithm, Round, neighbour_average
from p2pfl.gradients import gradients
from p2pfl.training import apply_step


class DPSGD(Algorithm):
    name = "dpsgd"
    summary = "D-PSGD (Lian et al. 2017): one SGD step per gossip round"
    training = {"lr": 0.1, "batch_size": 10, "momentum": 0.0}

    def round(self, round_index: int) -> Round:
        ctx = self.ctx
        opt = ctx.sgd()
        index, mask = ctx.minibatch(round_index, opt.batch_size)
        noise = (
            ctx.stack.dropout_noise(ctx.peer_keys("dropout", round_index), opt.batch_size)
            if ctx.stack.dropouts
            else None
        )
        grad, losses = gradients(ctx.stack, ctx.flat, ctx.data.train_x[index], ctx.data.train_y[index], mask, noise)
        ctx.flat = neighbour_average(ctx, round_index, ctx.flat)
        stepping = mask.sum(1) > 0
        offline = ctx.offline_rows(round_index)
        stepping[offline] = False
        losses[offline] = float("nan")
        apply_step(ctx.flat, grad, stepping, opt, ctx.lr(round_index), None)
        return Round(losses)
