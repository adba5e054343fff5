"""FedNova (Wang et al. 2020) on the star: normalized averaging of local progress."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from p2pfl.algorithms.server import ClientWork
from p2pfl.algorithms.star.fedavg import FedAvg
from p2pfl.comm import Payload
from p2pfl.local.training import local_steps


@dataclass
class FedNovaUpload(Payload):
    weights: torch.Tensor
    norm: torch.Tensor  # (1,): the client's ||a_i||_1


class FedNova(FedAvg):
    """FedNova (Wang et al. 2020): each client's change is normalized by its number of local steps
    (with momentum rho, by ||a_i||_1 = (tau - rho (1 - rho^tau) / (1 - rho)) / (1 - rho)), then the
    server steps tau_eff = sum p_i ||a_i||_1 along the weighted mean of the normalized changes."""

    name = "fednova"
    withstands_threats = False  # its server normalises the updates: not the average the threats act on
    private_training = False
    summary = "FedNova: normalized averaging of local progress"
    Upload = FedNovaUpload

    def client_work(self, round_index, clients, received):
        opt = self.sgd()
        trained, losses = self.local_train(round_index, clients, received)
        out = {}
        for i, c in enumerate(clients):
            tau, rho = local_steps(len(self.ctx.shards[c]), opt), opt.momentum
            norm = tau if not rho else (tau - rho * (1 - rho**tau) / (1 - rho)) / (1 - rho)
            upload = FedNovaUpload(trained[i], torch.tensor([float(norm)], device=trained.device))
            out[c] = ClientWork(upload, trained[i], losses[i])
        return out

    def server_update(self, round_index, clients, uploads):
        p, w = self.weights_of(clients), self.ctx.global_weights
        norms = torch.cat([uploads[c].norm for c in clients])
        direction = sum(p[i] * (w - uploads[c].weights) / norms[i] for i, c in enumerate(clients))
        return w - (p * norms).sum() * direction
