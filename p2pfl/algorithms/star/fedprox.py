"""FedProx (Li et al. 2020): FedAvg with a proximal term in every local step."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from p2pfl.algorithms.star.fedavg import FedAvg, FedAvgSettings
from p2pfl.settings.fields import non_negative, option
from p2pfl.local.training import StepTerms


@dataclass(frozen=True)
class FedProxSettings(FedAvgSettings):
    prox_mu: float = option(0.01, "FedProx proximal coefficient mu", non_negative)


class FedProx(FedAvg):
    """FedAvg with the proximal term (mu/2)||w - w_global||^2 in every local step (--prox-mu)."""

    name = "fedprox"
    summary = "FedAvg with a proximal term mu/2 ||w - w_global||^2"
    Settings = FedProxSettings

    def sgd(self):
        return replace(super().sgd(), prox_mu=self.settings.prox_mu)

    def terms(self, clients, received):
        return StepTerms(anchor=torch.stack([received[c].weights for c in clients]))
