"""D² (Tang, Lian, Yan, Zhang and Liu, ICML 2018, Algorithm 1): D-PSGD with a correction that cancels the
spread of the peers' gradients, so that its rate no longer depends on how different their data are:

    x_i^1     = sum_j W_ij (x_j^0 - lr g_j^0)
    x_i^(t+1) = sum_j W_ij (2 x_j^t - x_j^(t-1) - lr g_j^t + lr g_j^(t-1))

g is the gradient of the whole objective (minibatch loss plus --weight-decay). The paper assumes W symmetric
and doubly stochastic with every eigenvalue above -1/3; on the plain ring with uniform weights (eigenvalue
-1/3) it diverges. The condition is checked on the run's W before any work. Where W fails it, D² mixes
with (I + W)/2, whose eigenvalues are at least 0 (the lazy W of exact diffusion, Yuan et al. 2019, D²'s
form for a general W), and the run header says so; --d2-lazy takes the lazy W always, --no-d2-lazy never
(a W that fails is then refused in one line). Where W meets the condition, W is the paper's. The graph is
static: the recursion differences two rounds of one W, so --static is its default (a family drawn anew
each round is drawn once), and a graph that changes by design is refused.

Numerics: the recursion keeps the peers' mean moving by x^t - x^(t-1), so it adds up every rounding of the
mixing sums: in float32 throughout, this convex check (docs/optimizers.md) falls to a gradient norm of 8e-5
by round 500 and climbs to 2.6e-4 by round 2,000, where float64 reaches 1.5e-11. So each peer keeps x^t,
x^(t-1) and g^(t-1) in float64, receivers sum in float64, and the float32 message a peer sends carries the
rounding its previous one left out (error feedback): the bytes are float32's, and the same run falls below
1e-7 (a float64 numpy model of the three variants: 2.6e-4 all float32, 9e-5 without the feedback, 8.7e-8
with it, at round 2,000).

Compared with the code of Lin et al. 2021 (epfml/quasi-global-momentum, pcode/optim/decentralized_d2.py):
the same recursion, theirs in float32 and without the eigenvalue check. Offline peers (--drop-peers) keep
their weights and their history; lost messages are averaged out as in D-PSGD, which the analysis does not
cover.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from p2pfl.algorithms.base import Algorithm, Round, neighbour_average, refuse_momentum
from p2pfl.errors import UserError
from p2pfl.settings.fields import option
from topologies import as_matrix, lazy, mixing_weights

SMALLEST = -1 / 3  # the paper's bound on W's eigenvalues


@dataclass(frozen=True)
class D2Settings:
    d2_lazy: bool | None = option(
        None,
        "D²: mix with (I + W)/2, whose eigenvalues are >= 0 (D²'s condition: above -1/3); --no-d2-lazy: W as it "
        "is, refused where it fails the condition",
        shown="only where W fails the condition",
    )


class D2(Algorithm):
    name = "d2"
    summary = "D² (Tang et al. 2018): D-PSGD corrected for the spread of the peers' data"
    static_graph = True  # the recursion differences two rounds of one W
    Settings = D2Settings
    training = {"lr": 0.1, "batch_size": 10, "momentum": 0.0}
    state = {"current": "peer", "previous": "peer", "previous_gradient": "peer", "unsent": "peer"}

    @classmethod
    def check(cls, cfg) -> None:
        refuse_momentum(cls, cfg)
        if "static" not in cfg.given:  # its W is one fixed matrix: one graph for the run unless told otherwise
            cfg.static = True

    def __init__(self, ctx, settings=None):
        super().__init__(ctx, settings)
        graph = ctx.schedule.graph(0)
        self.weights = mixing_weights(graph, ctx.cfg.mixing, ctx.sample_counts)
        w = as_matrix(self.weights, graph.number_of_nodes())
        if not np.allclose(w, w.T, atol=1e-12):
            raise UserError(
                f"--algo d2 needs a symmetric W (Tang et al. 2018, Assumption 1); --mixing {ctx.cfg.mixing} on "
                f"this {'directed ' if graph.is_directed() else ''}graph is not: use --mixing metropolis on an "
                "undirected graph"
            )
        self.smallest = float(np.linalg.eigvalsh(w)[0])
        fails = self.smallest <= SMALLEST + 1e-9
        if fails and self.settings.d2_lazy is False:
            raise UserError(
                f"--algo d2: W's smallest eigenvalue is {self.smallest:.4f}; D² needs every eigenvalue above -1/3 "
                "(Tang et al. 2018, Assumption 1), or it diverges; drop --no-d2-lazy, and D² mixes with (I + W)/2"
            )
        self.lazy = bool(self.settings.d2_lazy) or fails
        if self.lazy:
            self.weights = lazy(self.weights)
        trainable = ctx.stack.layout.trainable
        self.current = ctx.flat[:, :trainable].double()  # x^t, of which ctx.flat holds the float32 copy
        self.previous = self.current.clone()  # x^(t-1)
        self.previous_gradient = torch.zeros_like(self.current)  # g^(t-1)
        self.unsent = torch.zeros_like(self.current)  # the rounding the last float32 message left out

    def notes(self) -> list[str]:
        if not self.lazy or self.settings.d2_lazy:
            return []
        return [
            f"D²: W's smallest eigenvalue is {self.smallest:.4f}, not above -1/3 as the paper needs: it mixes with "
            "(I + W)/2 (--no-d2-lazy refuses such a W instead)"
        ]

    def round(self, round_index: int) -> Round:
        ctx = self.ctx
        grad, losses, stepping = ctx.objective_gradients(round_index)
        grad, lr, x = grad.double(), ctx.lr(round_index), self.current
        if round_index == 0:
            step = x - lr * grad
        else:
            step = 2 * x - self.previous - lr * (grad - self.previous_gradient)
        keep = stepping[:, None]
        step = torch.where(keep, step, x) + self.unsent
        sent = ctx.flat.clone()
        sent[:, : x.shape[1]] = step
        self.unsent = step - sent[:, : x.shape[1]].double()
        self.previous = torch.where(keep, x, self.previous)
        self.previous_gradient = torch.where(keep, grad, self.previous_gradient)
        mixed = neighbour_average(ctx, round_index, sent, weights=self.weights, dtype=torch.float64)
        self.current = mixed[:, : x.shape[1]].contiguous()
        ctx.flat = mixed.to(ctx.flat.dtype)
        return Round(losses)
