"""Data sharing (Zhao et al. 2018) on the star: FedAvg with a shared global set mixed into local training."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from p2pfl.algorithms.star.central import Samples
from p2pfl.algorithms.star.fedavg import FedAvg, FedAvgSettings
from p2pfl.settings.fields import fraction, option


@dataclass(frozen=True)
class DataShareSettings(FedAvgSettings):
    share_fraction: float = option(0.1, "the global set's fraction of all clients' samples", fraction)


class DataShare(FedAvg):
    """Data sharing (Zhao et al. 2018, as NTK-FL's baseline): the server holds a global set of
    --share-fraction of all clients' training samples and sends it to every client once (round 1,
    phase 'share'); each round a client trains on its shard plus as many samples drawn from it."""

    name = "datashare"
    withstands_threats = False  # its shared data is the server's: not the average the threats act on
    private_training = False
    state = {"has_share": "peer"}  # which clients the one-time share reached (simulated faults)
    summary = "FedAvg with a shared global set mixed into local training"
    Settings = DataShareSettings

    def __init__(self, ctx):
        super().__init__(ctx)
        union = torch.cat(ctx.shards).unique()
        rng = ctx.rng("share")
        size = max(1, int(round(self.settings.share_fraction * len(union))))
        self.shared = torch.from_numpy(np.sort(rng.choice(union.numpy(), size, replace=False)))
        self.has_share = torch.zeros(len(ctx.peers), dtype=torch.bool, device=ctx.device)

    def round(self, round_index):
        if round_index == 0:
            self.send_shared()
        return super().round(round_index)

    def send_shared(self):
        ctx = self.ctx
        payload = Samples(*ctx.rows(self.shared))
        reached = self.broadcast("share", 0, range(ctx.cfg.peers), lambda c: payload, Samples)
        self.has_share = torch.tensor([c in reached for c in ctx.peers], dtype=torch.bool, device=ctx.device)

    def local_train(self, round_index, clients, received, terms=None):
        ctx, original = self.ctx, self.ctx.shards
        mixed = list(original)
        for c in clients:
            if not self.has_share[ctx.row[c]]:  # the share did not reach it (simulated faults)
                continue
            rng = ctx.rng("share-mix", round_index, c)
            extra = self.shared[rng.choice(len(self.shared), min(len(original[c]), len(self.shared)), False)]
            mixed[c] = torch.cat([original[c], extra])
        ctx.shards = mixed
        try:
            return super().local_train(round_index, clients, received, terms)
        finally:
            ctx.shards = original
