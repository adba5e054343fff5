"""NTK-FL and CP-NTK-FL (Yue et al., ICML 2022) on the star.

NTK-FL: the sampled clients send the Jacobians of their samples at the broadcast weights, with labels
and outputs; the server builds the kernel of all of them, evolves, keeps the best candidate t and
replaces the global model (the same NTK step as NTK-DFL, at the hub).

CP-NTK-FL adds: each client uses a fraction beta of its samples each round (--cp-beta), inputs are
projected with a shared-seed Gaussian matrix (--ntk-projection, the model's input size becomes d1';
the test set is projected too), Jacobians are top-k sparsified (--ntk-topk), and a shuffling server
permutes the (J, f, Y) rows jointly before the aggregator sees them (the update does not change:
tests check it). Its t is picked on the evolved outputs (--ntk-selection linearized), since the
aggregator holds no raw samples.
"""
from __future__ import annotations

import numpy as np
import torch

from p2pfl.algorithms.server import ServerAlgorithm
from p2pfl.ntk.codec import JacobianCodec, ntk_settings, tau_histogram
from p2pfl.ntk.step import ntk_step
from p2pfl.seeding import numpy_rng, torch_generator
from p2pfl.training import candidate_losses


class NTKFL(ServerAlgorithm):
    trains_locally = False

    def __init__(self, ctx):
        super().__init__(ctx)
        self.settings = ntk_settings(ctx.cfg)
        self.codec = JacobianCodec(ctx)
        self.beta = ctx.cfg.extras.get("cp_beta", 1.0)
        self.shuffle = ctx.cfg.algo == "cp-ntk-fl"
        self.taus_chosen: list[int] = []

    def samples(self, round_index: int, client: int) -> torch.Tensor:
        shard = self.ctx.shards[client].numpy()
        if self.beta < 1:
            keep = max(1, int(round(self.beta * len(shard))))
            shard = np.sort(numpy_rng(self.ctx.cfg.seed, "cp-sample", round_index, client).choice(shard, keep, False))
        return torch.from_numpy(shard)

    def client_work(self, round_index, clients, received, losses):
        ctx, out = self.ctx, {}
        for c in clients:
            index = self.samples(round_index, c).to(ctx.device)
            x, y = ctx.data.train_x[index], ctx.data.train_y[index]
            jac, f = self.codec.compute(received[c][0], x)
            ctx.flat[self.row[c]] = received[c][0]
            payload, dense = self.codec.pack(jac, f, y)
            out[c] = ((*payload, index), dense)  # the indices stand for the inputs 'network' selection reads
        return out

    def server_update(self, round_index, clients, uploads):
        ctx, w = self.ctx, self.ctx.global_weights
        parts = [self.codec.unpack(uploads[c][:-1]) for c in clients]
        jac = self.codec.cat([p[0] for p in parts])
        f0 = torch.cat([p[1] for p in parts])
        labels = torch.cat([p[2] for p in parts])
        index = torch.cat([uploads[c][-1] for c in clients])
        if self.shuffle:
            order = torch.randperm(len(labels), generator=torch_generator(ctx.cfg.seed, "shuffler", round_index))
            jac, f0, labels, index = jac.rows(order.to(f0.device)), f0[order], labels[order], index[order]
        x = ctx.data.train_x[index]
        result = ntk_step(jac, self.codec.shape, w, f0, labels, ctx.data.n_classes, ctx.lr(round_index),
                          self.settings, lambda cands: candidate_losses(ctx.stack, cands, x, labels))
        self.taus_chosen.append(result.tau)
        return result.weights

    def finish(self, run_dir):
        if not self.is_server:
            return None
        return {"tau_histogram": tau_histogram(self.taus_chosen)}
