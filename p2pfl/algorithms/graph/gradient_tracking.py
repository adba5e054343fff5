"""Gradient tracking (DSGT: Pu and Nedić, Math. Programming 2021; the analysis of Koloskova, Lin and Stich,
NeurIPS 2021, Algorithm 1). Each peer keeps y_i, a tracker of the peers' average gradient, and steps along it
instead of its own gradient; on heterogeneous data this removes the bias that D-PSGD keeps at any constant lr:

    x_i <- sum_j W_ij (x_j - lr y_j)
    y_i <- sum_j W_ij y_j + g_i(new x_i) - g_i(old x_i)          y_i starts as g_i(x_i)

Held here one round later, so that a round takes one gradient and makes one exchange, as the paper's: round
k takes g_i^k at x_i^k and completes y_i^k = (W y^(k-1))_i + g_i^k - g_i^(k-1) from the mixed tracker the
previous round kept (both zero before round 1, so y_i^0 = g_i^0), then sends x_i - lr y_i and y_i in one
message of two vectors (the bytes count both). g is the gradient of the whole objective: minibatch loss plus
--weight-decay.

Compared with the code of Lin et al. 2021 (epfml/quasi-global-momentum,
pcode/optim/decentralized_sgd_with_gradient_tracking.py): theirs takes x_i <- sum_j W_ij x_j - lr y_i (the
step after mixing, with the peer's own tracker); this is the Koloskova et al. form (the step before mixing).
Both track the same average; the convex check in docs/optimizers.md runs this one. Offline peers
(--drop-peers) neither step nor change their tracker; a lost message is averaged out as in D-PSGD, which
the tracking analysis does not cover.
"""

from __future__ import annotations

import torch

from p2pfl.algorithms.base import Algorithm, Round, neighbour_average, refuse_momentum


class GradientTracking(Algorithm):
    name = "gt"
    summary = "gradient tracking (DSGT, Pu and Nedić 2021): steps along a tracked average gradient"
    directed_graphs = True  # averaging reads in-neighbours; W must keep the mean (doubly stochastic)
    training = {"lr": 0.1, "batch_size": 10, "momentum": 0.0}
    state = {"mixed_tracker": "peer", "gradient": "peer"}

    @classmethod
    def check(cls, cfg) -> None:
        refuse_momentum(cls, cfg)

    def __init__(self, ctx, settings=None):
        super().__init__(ctx, settings)
        trainable = ctx.stack.layout.trainable
        self.mixed_tracker = torch.zeros(len(ctx.peers), trainable, device=ctx.device)  # (W y^(k-1))_i
        self.gradient = torch.zeros_like(self.mixed_tracker)  # g_i^(k-1)

    def round(self, round_index: int) -> Round:
        ctx = self.ctx
        grad, losses, stepping = ctx.objective_gradients(round_index)
        grad = torch.where(stepping[:, None], grad, self.gradient)  # a peer that did not step keeps its g
        tracker = self.mixed_tracker + grad - self.gradient
        self.gradient = grad
        sent = ctx.flat.clone()
        sent[:, : tracker.shape[1]] -= ctx.lr(round_index) * tracker * stepping[:, None]
        mixed = neighbour_average(ctx, round_index, torch.cat([sent, tracker], 1))
        ctx.flat, self.mixed_tracker = (
            mixed[:, : ctx.flat.shape[1]].contiguous(),
            mixed[:, ctx.flat.shape[1] :].contiguous(),
        )
        return Round(losses)
