"""FedAvg on the star: clients start each round from the global weights they were sent, train
locally, and the server takes the sample-weighted average of the sampled clients.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from p2pfl.algorithms.server import ClientWork, ServerAlgorithm, ServerOptions
from p2pfl.comm import Weights
from p2pfl.settings.fields import non_negative, option
from p2pfl.local.training import SGDSettings, StepTerms, local_steps


@dataclass(frozen=True)
class FedAvgSettings(ServerOptions):
    local_steps: int = option(
        0, "a fixed number of local SGD steps instead of --local-epochs (0 = epochs)", non_negative
    )


class FedAvg(ServerAlgorithm):
    """Local SGD from the global weights, then the sample-size-weighted average of the sampled clients."""

    name = "fedavg"
    summary = "FedAvg: local SGD, sample-weighted average of the sampled clients"
    Settings = FedAvgSettings
    training = {"lr": 0.1, "batch_size": 50, "local_epochs": 5, "momentum": 0.0}
    withstands_threats = True  # its server_update averages the uploads, where p2pfl.threats act
    private_training = True

    def work_steps(self, n_samples: int) -> int:
        return local_steps(n_samples, self.sgd())

    def local_train(self, round_index, clients, received, terms=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(the clients' weights after local SGD from what they received, their training losses)."""
        trained = torch.stack([received[c].weights for c in clients])
        return trained, self.ctx.train(round_index, trained, clients, self.sgd(), terms)

    def sgd(self) -> SGDSettings:
        return self.ctx.sgd(steps=self.settings.local_steps or None)

    def client_work(self, round_index, clients, received):
        trained, losses = self.local_train(round_index, clients, received, self.terms(clients, received))
        return {c: ClientWork(Weights(trained[i]), trained[i], losses[i]) for i, c in enumerate(clients)}

    def terms(self, clients, received) -> StepTerms | None:
        return None

    def server_update(self, round_index, clients, uploads):
        p = self.weights_of(clients)
        threats = self.ctx.threats
        if threats is not None:  # Byzantine clients' uploads and a robust rule at the server
            heard = [(c, float(p[i]), uploads[c].weights) for i, c in enumerate(clients)]
            return threats.average(
                round_index, self.server, self.ctx.global_weights, heard, threats.bound_among(clients)
            )
        return sum(p[i] * uploads[c].weights for i, c in enumerate(clients))
