"""The centralized-training upper bound on the star: the sampled clients upload their data."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from p2pfl.algorithms.server import ClientWork
from p2pfl.algorithms.star.fedavg import FedAvg
from p2pfl.comm import Payload


@dataclass
class Samples(Payload):
    x: torch.Tensor
    y: torch.Tensor


class Centralized(FedAvg):
    """The upper bound: the sampled clients upload their raw data and the server trains the global
    model on the union, with the same local settings."""

    name = "central"
    withstands_threats = False  # its server trains on pooled samples: not the average the threats act on
    private_training = False
    summary = "upper bound: the server trains on the sampled clients' data"
    trains_locally = False
    Upload = Samples

    def client_work(self, round_index, clients, received):
        return {c: ClientWork(Samples(*self.ctx.samples(c))) for c in clients}

    def server_update(self, round_index, clients, uploads):
        ctx = self.ctx
        union = torch.cat([ctx.shards[c] for c in clients])
        w = ctx.global_weights[None].clone()
        ctx.train(round_index, w, [self.server], self.sgd(), shards=[union])
        return w[0]
