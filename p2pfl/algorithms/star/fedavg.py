"""The FedAvg family on the star: FedAvg, FedProx, SCAFFOLD, FedNova, Data Share, and a centralized-
training upper bound. Clients start each round from the global weights they were sent."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from p2pfl.algorithms.server import ServerAlgorithm, ServerOptions
from p2pfl.options import fraction, non_negative, option
from p2pfl.comm import Payload, Weights
from p2pfl.training import SGDSettings, StepTerms, local_steps


@dataclass(frozen=True)
class FedAvgSettings(ServerOptions):
    local_steps: int = option(0, "a fixed number of local SGD steps instead of --local-epochs (0 = epochs)",
                              non_negative)


@dataclass(frozen=True)
class FedProxSettings(FedAvgSettings):
    prox_mu: float = option(0.01, "FedProx proximal coefficient mu", non_negative)


@dataclass(frozen=True)
class DataShareSettings(FedAvgSettings):
    share_fraction: float = option(0.1, "the global set's fraction of all clients' samples", fraction)


@dataclass
class ScaffoldDownload(Payload):
    weights: torch.Tensor
    control: torch.Tensor  # the server's control variate c


@dataclass
class ScaffoldUpload(Payload):
    delta_weights: torch.Tensor
    delta_control: torch.Tensor


@dataclass
class FedNovaUpload(Payload):
    weights: torch.Tensor
    norm: torch.Tensor  # (1,): the client's ||a_i||_1


@dataclass
class Samples(Payload):
    x: torch.Tensor
    y: torch.Tensor


class FedAvg(ServerAlgorithm):
    """Local SGD from the global weights, then the sample-size-weighted average of the sampled clients."""

    name = "fedavg"
    summary = "FedAvg: local SGD, sample-weighted average of the sampled clients"
    Settings = FedAvgSettings
    training = {"lr": 0.1, "batch_size": 50, "local_epochs": 5, "momentum": 0.0}

    def local_train(self, round_index, clients, received, losses, terms=None) -> torch.Tensor:
        ctx = self.ctx
        trained = torch.stack([received[c].weights for c in clients])
        out = ctx.train(round_index, trained, clients, self.sgd(), terms)
        for i, c in enumerate(clients):
            ctx.flat[ctx.row[c]] = trained[i]
            losses[ctx.row[c]] = out[i]
        return trained

    def sgd(self) -> SGDSettings:
        opt = self.ctx.sgd()
        opt.steps = self.settings.local_steps or None
        return opt

    def client_work(self, round_index, clients, received, losses):
        trained = self.local_train(round_index, clients, received, losses, self.terms(clients, received))
        return {c: (Weights(trained[i]), None) for i, c in enumerate(clients)}

    def terms(self, clients, received) -> StepTerms | None:
        return None

    def server_update(self, round_index, clients, uploads):
        p = self.weights_of(clients)
        return sum(p[i] * uploads[c].weights for i, c in enumerate(clients))


class FedProx(FedAvg):
    """FedAvg with the proximal term (mu/2)||w - w_global||^2 in every local step (--prox-mu)."""

    name = "fedprox"
    summary = "FedAvg with a proximal term mu/2 ||w - w_global||^2"
    Settings = FedProxSettings

    def sgd(self):
        opt = super().sgd()
        opt.prox_mu = self.settings.prox_mu
        return opt

    def terms(self, clients, received):
        return StepTerms(anchor=torch.stack([received[c].weights for c in clients]))


class Scaffold(FedAvg):
    """SCAFFOLD (Karimireddy et al. 2020, option II): local steps corrected by c - c_i; clients return
    the weight and control-variate deltas, so traffic doubles both ways. Global step size 1."""

    name = "scaffold"
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

    def client_work(self, round_index, clients, received, losses):
        ctx, opt = self.ctx, self.sgd()
        rows = [ctx.row[c] for c in clients]
        c_global = torch.stack([received[c].control for c in clients])
        start = torch.stack([received[c].weights for c in clients])
        trained = self.local_train(round_index, clients, received, losses,
                                   StepTerms(offset=c_global - self.c_local[rows]))
        steps = torch.tensor([local_steps(len(ctx.shards[c]), opt) for c in clients], device=ctx.device)
        new_c = self.c_local[rows] - c_global + (start - trained) / (steps[:, None] * ctx.lr(round_index))
        delta_c = new_c - self.c_local[rows]
        self.c_local[rows] = new_c
        return {c: (ScaffoldUpload(trained[i] - start[i], delta_c[i]), None) for i, c in enumerate(clients)}

    def server_update(self, round_index, clients, uploads):
        dw = torch.stack([uploads[c].delta_weights for c in clients]).mean(0)
        dc = torch.stack([uploads[c].delta_control for c in clients]).sum(0)
        self.c_global = self.c_global + dc / self.ctx.cfg.peers
        return self.ctx.global_weights + dw


class FedNova(FedAvg):
    """FedNova (Wang et al. 2020): each client's change is normalized by its number of local steps
    (with momentum rho, by ||a_i||_1 = (tau - rho (1 - rho^tau) / (1 - rho)) / (1 - rho)), then the
    server steps tau_eff = sum p_i ||a_i||_1 along the weighted mean of the normalized changes."""

    name = "fednova"
    summary = "FedNova: normalized averaging of local progress"
    Upload = FedNovaUpload

    def client_work(self, round_index, clients, received, losses):
        opt = self.sgd()
        trained = self.local_train(round_index, clients, received, losses)
        out = {}
        for i, c in enumerate(clients):
            tau, rho = local_steps(len(self.ctx.shards[c]), opt), opt.momentum
            norm = tau if not rho else (tau - rho * (1 - rho**tau) / (1 - rho)) / (1 - rho)
            out[c] = (FedNovaUpload(trained[i], torch.tensor([float(norm)], device=trained.device)), None)
        return out

    def server_update(self, round_index, clients, uploads):
        p, w = self.weights_of(clients), self.ctx.global_weights
        norms = torch.cat([uploads[c].norm for c in clients])
        direction = sum(p[i] * (w - uploads[c].weights) / norms[i] for i, c in enumerate(clients))
        return w - (p * norms).sum() * direction


class Centralized(FedAvg):
    """The upper bound: the sampled clients upload their raw data and the server trains the global
    model on the union, with the same local settings."""

    name = "central"
    summary = "upper bound: the server trains on the sampled clients' data"
    trains_locally = False
    Upload = Samples

    def client_work(self, round_index, clients, received, losses):
        ctx = self.ctx
        return {c: (Samples(*ctx.samples(c)), None) for c in clients}

    def server_update(self, round_index, clients, uploads):
        ctx = self.ctx
        union = torch.cat([ctx.shards[c] for c in clients])
        w = ctx.global_weights[None].clone()
        ctx.train(round_index, w, [self.server], self.sgd(), shards=[union])
        return w[0]


class DataShare(FedAvg):
    """Data sharing (Zhao et al. 2018, as NTK-FL's baseline): the server holds a global set of
    --share-fraction of all clients' training samples and sends it to every client once (round 1,
    phase 'share'); each round a client trains on its shard plus as many samples drawn from it."""

    name = "datashare"
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

    def local_train(self, round_index, clients, received, losses, terms=None):
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
            return super().local_train(round_index, clients, received, losses, terms)
        finally:
            ctx.shards = original
