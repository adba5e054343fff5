"""MOON (Li et al. 2021), model-contrastive federated learning, with CyclicFL's settings: FedAvg whose
local loss adds mu times a contrastive loss that pulls each sample's representation (the penultimate
layer) towards the global model's and away from the client's own previous local model's.

Each client's previous model is its row of ctx.flat, the model it trained the last time it was sampled;
a client sampled for the first time takes the global model it received (MOON's code starts from the
global model; after CyclicFL's phase 1 that is the pre-trained model). Nothing beyond FedAvg's weights
is sent."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from p2pfl.algorithms.star.fedavg import FedAvg, FedAvgSettings
from p2pfl.settings.fields import non_negative, option, positive
from p2pfl.local.gradients import Contrast
from p2pfl.local.training import StepTerms


@dataclass(frozen=True)
class MoonSettings(FedAvgSettings):
    moon_mu: float = option(0.1, "MOON: weight mu of the contrastive loss (0: FedAvg)", non_negative)
    moon_temperature: float = option(0.5, "MOON: temperature of the contrastive loss", positive)


class Moon(FedAvg):
    name = "moon"
    private_training = False  # its contrastive term has no per-sample DP-SGD path here
    summary = "MOON: FedAvg with a model-contrastive loss on the representation"
    Settings = MoonSettings
    training = {"lr": 0.01, "batch_size": 32, "local_epochs": 5, "momentum": 0.0}
    state = {"trained": "peer"}

    def __init__(self, ctx):
        super().__init__(ctx)
        self.trained = torch.zeros(
            len(ctx.peers), dtype=torch.bool, device=ctx.device
        )  # this rank's clients with a previous model

    def terms(self, clients, received) -> StepTerms:
        global_weights = torch.stack([received[c].weights for c in clients])
        previous = torch.stack(
            [self.ctx.flat[self.ctx.row[c]] if self.trained[self.ctx.row[c]] else received[c].weights for c in clients]
        )
        self.trained[[self.ctx.row[c] for c in clients]] = True
        return StepTerms(
            contrast=Contrast(global_weights, previous, self.settings.moon_mu, self.settings.moon_temperature)
        )
