"""A decentralized algorithm of your own: local SGD, then a lazy gossip step that keeps part of the own
model and takes the rest from the neighbourhood average. Its settings take the gossip codecs' too, so
what crosses an edge may be compressed (--gossip-topk, --gossip-randk, --gossip-quant-bits).

    python -m p2pfl.run --algo lazy_gossip:LazyGossip --keep 0.5 --dataset synthetic   # PYTHONPATH=examples
    python -m p2pfl.run --algo lazy_gossip:LazyGossip --gossip-topk 0.1 --dataset synthetic
    p2pfl.simulate(algo=LazyGossip, keep=0.5, dataset="synthetic")
"""

from dataclasses import dataclass

import p2pfl


def below_one(value):
    return None if 0 <= value < 1 else f"must be in [0, 1), got {value}"


@dataclass(frozen=True)
class LazyGossipSettings(p2pfl.GossipSettings):
    keep: float = p2pfl.option(0.5, "share of its own model a peer keeps at averaging", below_one)


class LazyGossip(p2pfl.Algorithm):
    name = "lazy-gossip"
    summary = "local SGD, then a lazy step towards the neighbourhood average"
    Settings = LazyGossipSettings
    training = {"lr": 0.05, "batch_size": 16, "local_epochs": 1}

    @classmethod
    def check(cls, cfg):
        p2pfl.gossip_codec(cfg.settings)  # one codec at most, refused in one line before any work

    def __init__(self, ctx, settings=None):
        super().__init__(ctx, settings)
        self.codec = p2pfl.gossip_codec(self.settings)  # built once; None: dense

    def round(self, round_index):
        ctx = self.ctx
        losses = ctx.train_online(round_index, ctx.flat)
        mixed = p2pfl.neighbour_average(ctx, round_index, ctx.flat, codec=self.codec)
        ctx.flat = self.settings.keep * ctx.flat + (1 - self.settings.keep) * mixed
        return p2pfl.Round(losses)
