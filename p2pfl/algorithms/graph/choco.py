"""CHOCO-SGD (Koloskova, Stich and Jaggi, ICML 2019, Algorithm 2; the deep-learning study at ICLR 2020):
gossip with compressed messages that still reaches consensus. Each peer keeps a public estimate x_hat_i
of its weights that its neighbours track, and sends only the compressed difference from it:

    x_i <- x_i - lr g_i(x_i)                                   one SGD step on a minibatch
    q_i  = Q(x_i - x_hat_i)                                    sent to the out-neighbours
    x_hat_j <- x_hat_j + q_j          for j in N(i) + {i}
    x_i <- x_i + gamma sum_j W_ij (x_hat_j - x_hat_i)          the consensus step

held as the paper's memory-efficient form: s_i = sum_j W_ij x_hat_j, updated by sum_j W_ij q_j, so a peer
keeps two rows besides its weights whatever its degree. The estimates start at 0, as the paper's.

Its graph is static (s_i sums one fixed set of neighbours): a graph new each round, the one-peer exponential
graph and a function's graph are refused. Directed static graphs run (a peer tracks its in-neighbours).
Links are reliable in the paper: under --drop-links a lost q_j is not resent, and the receiver's s_i stays
off by W_ij q_j; an offline peer (--drop-peers) neither steps nor sends, so no estimate moves.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from p2pfl.algorithms.base import Algorithm, Round
from p2pfl.errors import UserError
from p2pfl.algorithms.public_copies import PublicCopies
from p2pfl.gossip.codecs import CODECS, QSGD, GossipCodec
from p2pfl.gossip.codec_settings import OWN, GossipSettings, gossip_codec
from p2pfl.settings.fields import fraction, option
from p2pfl.local.training import apply_step

PAPER_QSGD_TAU = 3.8  # 1 + min(d/s^2, sqrt(d)/s) at the paper's d = 2,000 and s = 16


@dataclass(frozen=True)
class ChocoSettings(GossipSettings):
    choco_gamma: float | None = option(
        None,
        "CHOCO-SGD's consensus step size gamma",
        fraction,
        shown="the codec's own (its choco_gamma): "
        + ", ".join(f"{c.name} {c.choco_gamma:g}" for c in [*CODECS.values(), GossipCodec]),
    )


class ChocoSGD(Algorithm):
    name = "choco"
    summary = "CHOCO-SGD (Koloskova et al. 2019): compressed gossip of differences from public estimates"
    directed_graphs = True  # s_i sums what i hears
    static_graph = True  # s_i sums one fixed set of neighbours
    Settings = ChocoSettings
    setting_defaults = {"gossip_topk": 0.01}  # the paper's headline codec: top-k 1%
    training = {"lr": 0.1, "batch_size": 10, "momentum": 0.0}
    state = {"copies.estimate": "peer", "copies.mixed": "peer"}

    @classmethod
    def check(cls, cfg) -> None:
        settings = cfg.settings
        other = ({c.setting.name for c in CODECS.values()} | {OWN}) - {"gossip_topk"}
        if other & cfg.given and "gossip_topk" not in cfg.given:  # another codec replaces the default top-k
            settings = dataclasses.replace(settings, gossip_topk=1.0)
        codec = gossip_codec(settings) or GossipCodec()
        if settings.choco_gamma is None:
            if codec.choco_gamma is None:
                raise UserError(
                    f"--algo choco: the gossip codec {codec.name} declares no consensus step (its choco_gamma); "
                    "give --choco-gamma"
                )
            settings = dataclasses.replace(settings, choco_gamma=codec.choco_gamma)
        cfg.settings = settings

    def __init__(self, ctx, settings=None):
        super().__init__(ctx, settings)
        self.codec = gossip_codec(self.settings) or GossipCodec()
        self.copies = PublicCopies(ctx, self.codec, torch.zeros_like(ctx.flat), torch.zeros_like(ctx.flat))

    def notes(self) -> list[str]:
        """QSGD's paper gamma was chosen where its rescaling was mild; say how far this model is from that."""
        if not isinstance(self.codec, QSGD):
            return []
        tau = 1 / self.codec.contraction(self.ctx.flat.shape[1])
        return [
            f"CHOCO-SGD: QSGD rescaled by 1/tau, tau = {tau:.1f} for {self.ctx.flat.shape[1]:,} weights (the "
            f"paper's gamma 0.34 was for tau {PAPER_QSGD_TAU}, 2,000 weights); gamma {self.settings.choco_gamma:g}"
            + (
                " may diverge here: on the 79,510-weight MLP it did, 0.1 did not"
                if tau > 2 * PAPER_QSGD_TAU and self.settings.choco_gamma >= 0.34
                else ""
            )
        ]

    def round(self, round_index: int) -> Round:
        ctx = self.ctx
        opt = ctx.sgd()
        grad, losses, stepping = ctx.stochastic_gradients(round_index, opt)
        apply_step(ctx.flat, grad, stepping, opt, ctx.lr(round_index), None)
        online = self.copies.send(round_index, ctx.flat)  # q_i = Q(x_i - x_hat_i); x_hat and s move by it
        rows = slice(None) if len(online) == len(ctx.peers) else online
        ctx.flat[rows] += self.settings.choco_gamma * (self.copies.mixed[rows] - self.copies.estimate[rows])
        return Round(losses)
