"""DFedAvg and DFedAvgM: local epochs of SGD (with momentum for M), then averaging with neighbours.

The order (train, then average) and the momentum reset each round follow NTK-DFL's baseline code.
Its "D-PSGD" (one local epoch of batch 10, then averaging) is this class with
--local-epochs 1 --batch-size 10 --lr 0.1; --algo dpsgd is the classic one-step D-PSGD.

With a gossip codec (--gossip-topk, --gossip-randk, --gossip-quant-bits) a peer sends the compressed change
of its weights since the copy its neighbours keep, and averages over those copies (p2pfl.algorithms.
public_copies), as decentralizepy's and the CHOCO-SGD authors' implementations send changes rather than
compressing the weights themselves; the copies need a static graph.
"""

from p2pfl.algorithms.base import Algorithm, Round, neighbour_average
from p2pfl.algorithms.public_copies import average_over_copies, starting_copies
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

    @classmethod
    def needs_static_graph(cls, settings) -> bool:
        return gossip_codec(settings) is not None  # the public copies sum one set of neighbours

    def __init__(self, ctx, settings=None):
        super().__init__(ctx, settings)
        codec = gossip_codec(self.settings)  # built once; None: dense
        self.copies = starting_copies(ctx, codec) if codec is not None else None

    @property
    def state(self) -> dict[str, str]:
        return {"copies.estimate": "peer", "copies.mixed": "peer"} if self.copies is not None else {}

    def round(self, round_index: int) -> Round:
        ctx = self.ctx
        losses = ctx.train_online(round_index, ctx.flat)
        if self.copies is None:
            ctx.flat = neighbour_average(ctx, round_index, ctx.flat)
        else:
            ctx.flat = average_over_copies(ctx, round_index, ctx.flat, self.copies)
        return Round(losses)


class DFedAvgM(DFedAvg):
    name = "dfedavgm"
    summary = "DFedAvg with heavy-ball momentum, reset each round"
    training = {"lr": 0.01, "batch_size": 50, "local_epochs": 20, "momentum": 0.9}
