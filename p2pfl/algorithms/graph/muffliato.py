"""Muffliato-SGD (Cyffers, Even, Bellet and Massoulié, NeurIPS 2022): each round every peer
takes a noised local step, then the peers gossip K times, so that each noise is spread over the graph
before a peer's model is read:

    x_i <- x_i - lr * (g_i(x_i) + noise_i)        (DP-SGD: --dp-clip, --dp-noise)
    x   <- W^K x                                  (K gossip steps, a message each)

The noise is what makes it private, so --dp-clip and --dp-noise are required. K defaults to
ceil(ln n / gap), the plain gossip steps that shrink the peers' spread by a factor of n; the paper gossips
with Chebyshev acceleration, which takes about ln n / sqrt(gap) steps for the same, and which p2pfl does
not run. Rows state local DP (dp_epsilon) and the paper's pairwise network DP (dp_epsilon_network;
docs/threats.md says how it is counted and how it differs from the authors' code, totilas/muffliato's
private.py). One graph for the whole run: the count is of one W's powers, so --static is its default.
D-PSGD with --gossip-steps K averages before its step instead, so each peer's model holds its own last
noise unaveraged.
"""

from __future__ import annotations

from dataclasses import dataclass

from p2pfl.algorithms.base import Round, refuse_momentum
from p2pfl.algorithms.public_copies import AveragerSettings, GossipAverager
from p2pfl.errors import UserError
from p2pfl.local.training import apply_step
from p2pfl.settings.fields import option, positive


@dataclass(frozen=True)
class MuffliatoSettings(AveragerSettings):
    gossip_steps: int | None = option(
        None,
        "gossip steps a round: a peer averages with its neighbours this many times, a message each",
        positive,
        shown="ceil(ln n / gap), the plain gossip steps that spread a noise over the graph",
    )


class Muffliato(GossipAverager):
    name = "muffliato"
    summary = "Muffliato-SGD (Cyffers et al. 2022): a noised step, then K gossip steps"
    Settings = MuffliatoSettings
    static_graph = True  # the privacy count is of one W's powers
    private_training = True
    training = {"lr": 0.1, "batch_size": 10, "momentum": 0.0}

    @classmethod
    def check(cls, cfg) -> None:
        super().check(cfg)
        refuse_momentum(cls, cfg)
        if not cfg.dp_clip:
            raise UserError("--algo muffliato adds noise to each step: give --dp-clip C and --dp-noise S")
        if "static" not in cfg.given:  # its count is of one W's powers: one graph for the run unless told otherwise
            cfg.static = True

    @classmethod
    def needs_static_graph(cls, settings) -> bool:
        return True

    def __init__(self, ctx, settings=None):
        super().__init__(ctx, settings)
        self.steps = self.settings.gossip_steps or self.spreading_steps()
        if self.steps is None:
            raise UserError(
                f"--algo muffliato: --mixing {ctx.cfg.mixing}'s W does not keep the peers' mean, so no spectral gap "
                "sets its gossip steps: give --gossip-steps K, or --mixing metropolis"
            )

    @property
    def gossip_steps(self) -> int:
        return self.steps

    def round(self, round_index: int) -> Round:
        ctx = self.ctx
        opt = ctx.sgd()
        grad, losses, stepping = ctx.stochastic_gradients(round_index, opt)
        apply_step(ctx.flat, grad, stepping, opt, ctx.lr(round_index), None)
        self.average(round_index)
        return Round(losses)
