"""SCAFFOLD (Karimireddy et al. 2020) on the star: control variates correct client drift."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from p2pfl.algorithms.server import ClientWork
from p2pfl.algorithms.star.fedavg import FedAvg
from p2pfl.comm import Payload
from p2pfl.local.training import StepTerms, local_steps


@dataclass
class ScaffoldDownload(Payload):
    weights: torch.Tensor
    control: torch.Tensor  # the server's control variate c


@dataclass
class ScaffoldUpload(Payload):
    delta_weights: torch.Tensor
    delta_control: torch.Tensor


class Scaffold(FedAvg):
    """SCAFFOLD (Karimireddy et al. 2020, option II): local steps corrected by c - c_i; clients return
    the weight and control-variate deltas, so traffic doubles both ways. Global step size 1."""

    name = "scaffold"
    withstands_threats = False  # its server also averages control variates: not the average the threats act on
    private_training = False
    summary = "SCAFFOLD: control variates correct client drift"
    Download, Upload = ScaffoldDownload, ScaffoldUpload
    state = {"c_local": "peer", "c_global": "server"}

    def __init__(self, ctx):
        super().__init__(ctx)
        self.c_local = torch.zeros_like(ctx.flat)
        if self.is_server:
            self.c_global = torch.zeros_like(ctx.global_weights)

    def download(self, round_index, client):
        return ScaffoldDownload(self.ctx.global_weights, self.c_global)

    def client_work(self, round_index, clients, received):
        ctx, opt = self.ctx, self.sgd()
        rows = [ctx.row[c] for c in clients]
        c_global = torch.stack([received[c].control for c in clients])
        start = torch.stack([received[c].weights for c in clients])
        trained, losses = self.local_train(
            round_index, clients, received, StepTerms(offset=c_global - self.c_local[rows])
        )
        steps = torch.tensor([local_steps(len(ctx.shards[c]), opt) for c in clients], device=ctx.device)
        new_c = self.c_local[rows] - c_global + (start - trained) / (steps[:, None] * ctx.lr(round_index))
        delta_c = new_c - self.c_local[rows]
        self.c_local[rows] = new_c
        return {
            c: ClientWork(ScaffoldUpload(trained[i] - start[i], delta_c[i]), trained[i], losses[i])
            for i, c in enumerate(clients)
        }

    def server_update(self, round_index, clients, uploads):
        dw = torch.stack([uploads[c].delta_weights for c in clients]).mean(0)
        dc = torch.stack([uploads[c].delta_control for c in clients]).sum(0)
        self.c_global = self.c_global + dc / self.ctx.cfg.peers
        return self.ctx.global_weights + dw
