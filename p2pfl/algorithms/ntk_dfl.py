"""NTK-DFL (Thompson et al.): per-round averaging, Jacobian exchange, local NTK evolution.

A round, each step a phase on the transport:
1. 'average': peers average weights with neighbours (--mixing uniform, the reference code and the
   paper's Algorithm 2; sample-weighted is eq. 1). Skipped with --ntk-no-avg (fig. 6 ablation).
2. 'weights': each peer sends its averaged weights back to its neighbours.
3. 'jacobians': peer i sends neighbour j the Jacobian of f(X_i; w_j), its labels Y_i and outputs
   f(X_i; w_j), so j holds its whole neighbourhood's Jacobians taken at its own weights.
4. each peer evolves its weights with the NTK of its neighbourhood and keeps the best candidate t.
With Jacobian batching (--ntk-batches m1) steps 2-4 repeat m1 times per round, each on 1/m1 of
every peer's samples; with data subsampling (--ntk-subsample m2) peers use 1/m2 of their samples,
drawn anew each round.

Selection of t (--ntk-selection): 'network' = the true network's cross-entropy on the neighbourhood's
samples (the reference code; a simulator shortcut: it reads the neighbours' inputs from the shared
dataset copy, which a deployment would have to send); 'linearized' = the loss of the evolved outputs
(the paper's appendix-C wording); 'own' = the true loss on the peer's own samples (no neighbour inputs
needed).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from p2pfl.algorithms.base import Algorithm, RunContext, neighbour_average
from p2pfl.comm import Message
from p2pfl.errors import UserError
from p2pfl.final_averaging import final_averaging
from p2pfl.ntk import DenseJacobian, FactoredJacobian, MLPShape
from p2pfl.ntk.compression import decode, encode
from p2pfl.ntk.step import NTKSettings, ntk_step
from p2pfl.seeding import numpy_rng


def ntk_settings(cfg) -> NTKSettings:
    e = cfg.extras
    return NTKSettings(e["ntk_loss"], tuple(e["ntk_taus"]), e["ntk_ode"], e["ntk_selection"])


def jacobian_path(cfg) -> str:
    """'auto' is factored, except where compression needs dense entries."""
    e = cfg.extras
    compress = e.get("ntk_topk", 1.0) < 1 or e.get("ntk_quant_bits", 0) > 0
    path = e.get("ntk_jacobian", "auto")
    if path == "auto":
        return "dense" if compress else "factored"
    if path == "factored" and compress:
        raise UserError("Jacobian compression acts on dense entries; use --ntk-jacobian dense (or auto)")
    return path


class JacobianCodec:
    """Computes a Jacobian at given weights and turns it into message tensors and back."""

    def __init__(self, ctx: RunContext):
        self.ctx = ctx
        self.path = jacobian_path(ctx.cfg)
        self.keep = ctx.cfg.extras.get("ntk_topk", 1.0)
        self.bits = ctx.cfg.extras.get("ntk_quant_bits", 0)
        self.shape = MLPShape.of(ctx.stack.model, ctx.stack.layout) if self.path == "factored" else None
        self.n_params = ctx.stack.layout.size

    def compute(self, w: torch.Tensor, x: torch.Tensor):
        if self.path == "factored":
            return FactoredJacobian.compute(self.shape, w, x)
        return DenseJacobian.compute(self.ctx.stack.model, self.ctx.stack.layout, w, x)

    def to_wire(self, jac) -> tuple[torch.Tensor, ...]:
        if self.path == "dense" and (self.keep < 1 or self.bits):
            return encode(jac.J, self.keep, self.bits)
        return jac.to_wire()

    def from_wire(self, tensors):
        if self.path == "factored":
            return FactoredJacobian.from_wire(tensors)
        if self.keep < 1 or self.bits:
            return DenseJacobian(decode(tuple(t.cpu() for t in tensors)).to(self.ctx.device))
        return DenseJacobian.from_wire(tensors)

    def cat(self, parts):
        return (FactoredJacobian if self.path == "factored" else DenseJacobian).cat(parts)

    def dense_nbytes(self, n: int, n_classes: int) -> int:
        return n * n_classes * self.n_params * 4


class NTKDFL(Algorithm):
    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        self.settings = ntk_settings(ctx.cfg)
        self.codec = JacobianCodec(ctx)
        self.batches = ctx.cfg.extras.get("ntk_batches", 1)
        self.subsample = ctx.cfg.extras.get("ntk_subsample", 1)
        self.no_avg = ctx.cfg.extras.get("ntk_no_avg", False)
        self.taus_chosen: list[int] = []

    def samples(self, round_index: int, peer: int) -> list[torch.Tensor]:
        """The peer's training indices used this round, split into the m1 Jacobian batches."""
        shard = self.ctx.shards[peer].numpy()
        if self.subsample > 1:
            keep = max(1, len(shard) // self.subsample)
            shard = np.sort(numpy_rng(self.ctx.cfg.seed, "subsample", round_index, peer).choice(shard, keep, False))
        parts = np.array_split(shard, min(self.batches, len(shard)))
        return [torch.from_numpy(parts[b % len(parts)]) for b in range(self.batches)]

    def round(self, round_index: int) -> torch.Tensor:
        ctx = self.ctx
        graph = ctx.schedule.graph(round_index)
        hood = {p: sorted(list(graph.neighbors(p)) + [p]) for p in range(ctx.cfg.peers)}
        weights = ctx.flat if self.no_avg else neighbour_average(ctx, round_index, ctx.flat)
        data = {p: self.samples(round_index, p) for p in set(q for p in ctx.peers for q in hood[p])}
        losses = torch.zeros(len(ctx.peers), device=ctx.device)
        for b in range(self.batches):
            losses = self.evolve_batch(round_index, graph, hood, weights, {p: d[b] for p, d in data.items()})
            weights = ctx.flat
        return losses

    def evolve_batch(self, round_index, graph, hood, weights, data) -> torch.Tensor:
        ctx = self.ctx
        eta = ctx.lr(round_index)
        row = {p: i for i, p in enumerate(ctx.peers)}
        n_classes = ctx.data.n_classes
        # 'weights': every peer's neighbours learn the weights their Jacobians are to be taken at
        msgs = [Message(p, j, (weights[row[p]],)) for p in ctx.peers for j in graph.neighbors(p)]
        inbox = ctx.transport.exchange("weights", round_index, msgs, [(j, p) for p in ctx.peers for j in graph.neighbors(p)])
        at = {p: weights[row[p]] for p in ctx.peers}
        at.update({j: w[0].to(ctx.device) for p in ctx.peers for j, w in inbox[p].items()})
        # 'jacobians': J of my samples at each neighbour's weights, with my labels and outputs
        own, msgs = {}, []
        for i in ctx.peers:
            x, y = ctx.data.train_x[data[i].to(ctx.device)], ctx.data.train_y[data[i].to(ctx.device)]
            for j in hood[i]:
                jac, f = self.codec.compute(at[j], x)
                if j == i:
                    own[i] = (jac, f.detach(), y)
                else:
                    payload = (*self.codec.to_wire(jac), f.detach(), y)
                    dense = self.codec.dense_nbytes(len(y), n_classes) + f.numel() * 4 + y.numel() * 8
                    msgs.append(Message(i, j, payload, dense_nbytes=dense))
        inbox = ctx.transport.exchange("jacobians", round_index, msgs,
                                       [(j, p) for p in ctx.peers for j in graph.neighbors(p)])
        new = ctx.flat.clone()
        losses = torch.zeros(len(ctx.peers), device=ctx.device)
        for p in ctx.peers:
            parts = [own[p] if j == p else self.unpack(inbox[p][j]) for j in hood[p]]
            jac = self.codec.cat([part[0] for part in parts])
            f0 = torch.cat([part[1] for part in parts]).to(ctx.device)
            labels = torch.cat([part[2] for part in parts]).to(ctx.device)
            selection_x, selection_y = self.selection_data(p, hood[p], data)
            result = ntk_step(jac, self.codec.shape, weights[row[p]], f0, labels, n_classes, eta, self.settings,
                              lambda cands: self.network_loss(cands, selection_x, selection_y))
            new[row[p]] = result.weights
            losses[row[p]] = result.losses.min()
            self.taus_chosen.append(result.tau)
        ctx.flat = new
        return losses

    def unpack(self, tensors):
        return self.codec.from_wire(tuple(t.to(self.ctx.device) for t in tensors[:-2])), tensors[-2], tensors[-1]

    def selection_data(self, peer, hood, data):
        members = [peer] if self.settings.selection == "own" else hood
        index = torch.cat([data[j] for j in members]).to(self.ctx.device)
        return self.ctx.data.train_x[index], self.ctx.data.train_y[index]

    @torch.no_grad()
    def network_loss(self, candidates: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = self.ctx.stack.forward(candidates, x, shared_input=True)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.repeat(len(candidates)),
                               reduction="none").view(len(candidates), -1).mean(1)

    def finish(self, run_dir) -> dict | None:
        result = final_averaging(self.ctx)
        chosen = self.ctx.transport.gather(self.taus_chosen)
        if result is not None:
            taus = [t for part in chosen for t in part]
            result["tau_histogram"] = {str(t): taus.count(t) for t in sorted(set(taus))}
            if run_dir is not None:
                from analysis.plots import plot_final_averaging

                plot_final_averaging(result, run_dir / "final_averaging.png")
        return result
