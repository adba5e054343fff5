"""DFedAvg and DFedAvgM: local epochs of SGD (with momentum for M), then averaging with neighbours.

The order (train, then average) and the momentum reset each round follow NTK-DFL's baseline code.
Its "D-PSGD" (one local epoch of batch 10, then averaging) is this class with
--local-epochs 1 --batch-size 10 --lr 0.1; --algo dpsgd is the classic one-step D-PSGD.
"""

from p2pfl.algorithms.base import Algorithm, Round, neighbour_average
from p2pfl.gossip.codec_settings import GossipSettings, gossip_codec


class DFedAvg(Algorithm):
    name = "dfedavg"
    summary = "local epochs of SGD, then averaging with neighbours"
    directed_graphs = True  # averaging reads in-neighbours only
    Settings = GossipSettings
    training = {"lr": 0.1, "batch_size": 25, "local_epochs": 20, "momentum": 0.0}

    @classmethod
    def check(cls, cfg) -> None:
        gossip_codec(cfg.settings)

    def __init__(self, ctx, settings=None):
        super().__init__(ctx, settings)
        self.codec = gossip_codec(self.settings)  # built once; None: dense

    def round(self, round_index: int) -> Round:
        ctx = self.ctx
        losses = ctx.train_online(round_index, ctx.flat)
        ctx.flat = neighbour_average(ctx, round_index, ctx.flat, codec=self.codec)
        return Round(losses)


class DFedAvgM(DFedAvg):
    name = "dfedavgm"
    summary = "DFedAvg with heavy-ball momentum, reset each round"
    training = {"lr": 0.01, "batch_size": 50, "local_epochs": 20, "momentum": 0.9}
