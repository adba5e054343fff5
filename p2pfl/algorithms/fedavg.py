"""The FedAvg family on the star: FedAvg, FedProx, SCAFFOLD, FedNova, and a centralized-training
upper bound. Clients start each round from the global weights they were sent."""
from __future__ import annotations

import numpy as np
import torch

from p2pfl.algorithms.server import ServerAlgorithm
from p2pfl.comm import Message
from p2pfl.seeding import numpy_rng
from p2pfl.training import StepTerms, local_steps, train_epochs


class FedAvg(ServerAlgorithm):
    """Local SGD from the global weights, then the sample-size-weighted average of the sampled clients."""

    def local_train(self, round_index, clients, received, losses, terms=None) -> torch.Tensor:
        ctx = self.ctx
        start = torch.stack([received[c][0] for c in clients])
        trained = start.clone()
        out = train_epochs(ctx.stack, trained, [ctx.shards[c] for c in clients], clients, ctx.data.train_x,
                           ctx.data.train_y, self.sgd(), ctx.lr(round_index), ctx.cfg.seed, round_index, terms)
        for i, c in enumerate(clients):
            ctx.flat[self.row[c]] = trained[i]
            losses[self.row[c]] = out[i]
        return trained

    def sgd(self):
        opt = self.ctx.sgd()
        opt.steps = self.ctx.cfg.extras.get("local_steps") or None
        opt.prox_mu = self.ctx.cfg.extras.get("prox_mu", 0.0) if self.ctx.cfg.algo == "fedprox" else 0.0
        return opt

    def client_work(self, round_index, clients, received, losses):
        trained = self.local_train(round_index, clients, received, losses, self.terms(clients, received))
        return {c: ((trained[i],), None) for i, c in enumerate(clients)}

    def terms(self, clients, received) -> StepTerms | None:
        return None

    def server_update(self, round_index, clients, uploads):
        p = self.weights_of(clients)
        return sum(p[i] * uploads[c][0] for i, c in enumerate(clients))


class FedProx(FedAvg):
    """FedAvg with the proximal term (mu/2)||w - w_global||^2 in every local step (--prox-mu)."""

    def terms(self, clients, received):
        return StepTerms(anchor=torch.stack([received[c][0] for c in clients]))


class Scaffold(FedAvg):
    """SCAFFOLD (Karimireddy et al. 2020, option II): local steps corrected by c - c_i; clients return
    the weight and control-variate deltas, so traffic doubles both ways. Global step size 1."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.c_local = torch.zeros_like(ctx.flat)
        if self.is_server:
            self.c_global = torch.zeros_like(ctx.global_weights)

    def download(self, round_index, client):
        return (self.ctx.global_weights, self.c_global)

    def client_work(self, round_index, clients, received, losses):
        ctx, opt = self.ctx, self.sgd()
        rows = [self.row[c] for c in clients]
        c_global = torch.stack([received[c][1] for c in clients])
        start = torch.stack([received[c][0] for c in clients])
        trained = self.local_train(round_index, clients, received, losses,
                                   StepTerms(offset=c_global - self.c_local[rows]))
        steps = torch.tensor([local_steps(len(ctx.shards[c]), opt) for c in clients], device=ctx.device)
        new_c = self.c_local[rows] - c_global + (start - trained) / (steps[:, None] * ctx.lr(round_index))
        delta_c = new_c - self.c_local[rows]
        self.c_local[rows] = new_c
        return {c: ((trained[i] - start[i], delta_c[i]), None) for i, c in enumerate(clients)}

    def server_update(self, round_index, clients, uploads):
        dw = torch.stack([uploads[c][0] for c in clients]).mean(0)
        dc = torch.stack([uploads[c][1] for c in clients]).sum(0)
        self.c_global = self.c_global + dc / self.ctx.cfg.peers
        return self.ctx.global_weights + dw


class FedNova(FedAvg):
    """FedNova (Wang et al. 2020): each client's change is normalized by its number of local steps
    (with momentum rho, by ||a_i||_1 = (tau - rho (1 - rho^tau) / (1 - rho)) / (1 - rho)), then the
    server steps tau_eff = sum p_i ||a_i||_1 along the weighted mean of the normalized changes."""

    def client_work(self, round_index, clients, received, losses):
        opt = self.sgd()
        trained = self.local_train(round_index, clients, received, losses)
        out = {}
        for i, c in enumerate(clients):
            tau, rho = local_steps(len(self.ctx.shards[c]), opt), opt.momentum
            norm = tau if not rho else (tau - rho * (1 - rho**tau) / (1 - rho)) / (1 - rho)
            out[c] = ((trained[i], torch.tensor([float(norm)], device=trained.device)), None)
        return out

    def server_update(self, round_index, clients, uploads):
        p, w = self.weights_of(clients), self.ctx.global_weights
        norms = torch.cat([uploads[c][1] for c in clients])
        direction = sum(p[i] * (w - uploads[c][0]) / norms[i] for i, c in enumerate(clients))
        return w - (p * norms).sum() * direction


class Centralized(FedAvg):
    """The upper bound: the sampled clients upload their raw data and the server trains the global
    model on the union, with the same local settings."""

    trains_locally = False

    def client_work(self, round_index, clients, received, losses):
        ctx = self.ctx
        return {c: ((ctx.data.train_x[ctx.shards[c].to(ctx.device)], ctx.data.train_y[ctx.shards[c].to(ctx.device)]),
                    None) for c in clients}

    def server_update(self, round_index, clients, uploads):
        ctx = self.ctx
        union = torch.cat([ctx.shards[c] for c in clients])
        w = ctx.global_weights[None].clone()
        train_epochs(ctx.stack, w, [union], [self.server], ctx.data.train_x, ctx.data.train_y, self.sgd(),
                     ctx.lr(round_index), ctx.cfg.seed, round_index)
        return w[0]


class DataShare(FedAvg):
    """Data sharing (Zhao et al. 2018, as NTK-FL's baseline): the server holds a global set of
    --share-fraction of all clients' training samples and sends it to every client once (round 1,
    phase 'share'); each round a client trains on its shard plus as many samples drawn from it."""

    def __init__(self, ctx):
        super().__init__(ctx)
        union = torch.cat(ctx.shards).unique()
        rng = numpy_rng(ctx.cfg.seed, "share")
        size = max(1, int(round(ctx.cfg.extras["share_fraction"] * len(union))))
        self.shared = torch.from_numpy(np.sort(rng.choice(union.numpy(), size, replace=False)))

    def round(self, round_index):
        if round_index == 0:
            self.send_shared()
        return super().round(round_index)

    def send_shared(self):
        ctx, index = self.ctx, self.shared.to(self.ctx.device)
        payload = (ctx.data.train_x[index], ctx.data.train_y[index])
        msgs = [Message(self.server, c, payload) for c in range(ctx.cfg.peers)] if self.is_server else []
        ctx.transport.exchange("share", 0, msgs, [(self.server, c) for c in ctx.peers])

    def local_train(self, round_index, clients, received, losses, terms=None):
        ctx, original = self.ctx, self.ctx.shards
        mixed = list(original)
        for c in clients:
            rng = numpy_rng(ctx.cfg.seed, "share-mix", round_index, c)
            extra = self.shared[rng.choice(len(self.shared), min(len(original[c]), len(self.shared)), False)]
            mixed[c] = torch.cat([original[c], extra])
        ctx.shards = mixed
        try:
            return super().local_train(round_index, clients, received, losses, terms)
        finally:
            ctx.shards = original
