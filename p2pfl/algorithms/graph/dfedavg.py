"""DFedAvg and DFedAvgM: local epochs of SGD (with momentum for M), then averaging with neighbours.

The order (train, then average) and the momentum reset each round follow NTK-DFL's baseline code.
Its "D-PSGD" (one local epoch of batch 10, then averaging) is this class with
--local-epochs 1 --batch-size 10 --lr 0.1; --algo dpsgd is the classic one-step D-PSGD.

With a gossip codec (--gossip-topk, --gossip-randk, --gossip-quant-bits) a peer sends the compressed change
of its weights since the copy its neighbours keep, and averages over those copies (p2pfl.algorithms.
public_copies), as decentralizepy's and the CHOCO-SGD authors' implementations send changes rather than
compressing the weights themselves; the copies need a static graph.
"""

from p2pfl.algorithms.base import Round
from p2pfl.algorithms.public_copies import GossipAverager
from p2pfl.local.training import local_steps


class DFedAvg(GossipAverager):
    name = "dfedavg"
    summary = "local epochs of SGD, then averaging with neighbours"
    training = {"lr": 0.1, "batch_size": 25, "local_epochs": 20, "momentum": 0.0}
    private_training = True

    def work_steps(self, n_samples: int) -> int:
        return local_steps(n_samples, self.ctx.sgd())

    def round(self, round_index: int) -> Round:
        losses = self.ctx.train_online(round_index, self.ctx.flat)
        self.average(round_index)
        return Round(losses)


class DFedAvgM(DFedAvg):
    name = "dfedavgm"
    summary = "DFedAvg with heavy-ball momentum, reset each round"
    training = {"lr": 0.01, "batch_size": 50, "local_epochs": 20, "momentum": 0.9}
