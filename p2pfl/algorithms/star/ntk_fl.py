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

import math
from dataclasses import dataclass

import numpy as np
import torch

from p2pfl.algorithms.ntk_options import NTKOptions, check_memory, make_codec, project_inputs
from p2pfl.algorithms.server import ServerAlgorithm, ServerOptions
from p2pfl.options import fraction, option
from p2pfl.comm import Payload
from p2pfl.ntk.codec import tau_histogram
from p2pfl.ntk.pixels import PixelInputs
from p2pfl.ntk.step import ntk_step
from p2pfl.seeding import numpy_rng, torch_generator
from p2pfl.training import candidate_losses


@dataclass(frozen=True)
class NTKFLSettings(ServerOptions, NTKOptions):
    pass


@dataclass(frozen=True)
class CPNTKFLSettings(NTKFLSettings):
    cp_beta: float = option(0.3, "data sampling rate beta: fraction of each client's samples per round", fraction)


@dataclass
class NTKUpload(Payload):
    """A client's Jacobian message plus the indices of its samples, which stand for the inputs that
    'network' selection reads (the simulator's shared dataset copy)."""

    outputs: torch.Tensor
    labels: torch.Tensor
    index: torch.Tensor
    jacobian: tuple[torch.Tensor, ...]


class NTKFL(ServerAlgorithm):
    name = "ntk-fl"
    summary = "NTK-FL: clients send Jacobians, the server evolves the global model"
    Settings = NTKFLSettings
    tasks = ("classification",)
    setting_defaults = {"ntk_taus": (100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1500, 2000)}
    training = {"lr": 0.01, "lr_decay": 0.0}
    trains_locally = False
    shuffle = False  # CP-NTK-FL's shuffling server
    Upload = NTKUpload
    pooled_state = ("taus_chosen",)

    def __init__(self, ctx):
        super().__init__(ctx)
        self.step_settings = self.settings.step_settings()
        self.codec = make_codec(ctx, self.settings)
        self.beta = self.sampling_rate()
        self.taus_chosen: list[int] = []
        largest = sorted(len(s) for s in ctx.shards)[-self.per_round:]
        check_memory(self.codec, self.settings, ctx.data.n_classes, sum(math.ceil(self.beta * n) for n in largest))

    @classmethod
    def prepare_data(cls, data, cfg):
        project_inputs(data, cfg)

    def sampling_rate(self) -> float:
        """The fraction of its samples a client uses each round (CP-NTK-FL's beta)."""
        return 1.0

    def samples(self, round_index: int, client: int) -> torch.Tensor:
        shard = self.ctx.shards[client].numpy()
        if self.beta < 1:
            keep = max(1, int(round(self.beta * len(shard))))
            shard = np.sort(numpy_rng(self.ctx.cfg.seed, "cp-sample", round_index, client).choice(shard, keep, False))
        return torch.from_numpy(shard)

    def client_work(self, round_index, clients, received, losses):
        ctx, out = self.ctx, {}
        for c in clients:
            index = self.samples(round_index, c)
            x, y = ctx.rows(index)
            jac, f = self.codec.compute(received[c].weights, x)
            ctx.flat[self.row[c]] = received[c].weights
            out[c] = (NTKUpload(f.detach(), y, index, self.codec.to_wire(jac)), self.codec.dense_bytes(f, y))
        return out

    def server_update(self, round_index, clients, uploads):
        ctx, w = self.ctx, self.ctx.global_weights
        parts = [self.codec.read(uploads[c].jacobian, uploads[c].outputs, uploads[c].labels) for c in clients]
        # the inputs as pixel codes where they are pixels: the factored products in integer arithmetic
        pixels = PixelInputs.cat([PixelInputs.encode(p[0].acts[0], ctx.data.pixel_levels) for p in parts]) \
            if self.codec.path == "factored" else None
        jac = self.codec.cat([p[0] for p in parts], pixels=pixels)
        f0 = torch.cat([p[1] for p in parts])
        labels = torch.cat([p[2] for p in parts])
        index = torch.cat([uploads[c].index for c in clients])
        if self.shuffle:
            order = torch.randperm(len(labels), generator=torch_generator(ctx.cfg.seed, "shuffler", round_index))
            jac, f0, labels, index = jac.rows(order.to(f0.device)), f0[order], labels[order], index[order]
        x, pixels = ctx.rows(index)[0], getattr(jac, "pixels", None)
        result = ntk_step(jac, self.codec.shape, w, f0, labels, ctx.data.n_classes, ctx.lr(round_index),
                          self.step_settings, lambda cands: candidate_losses(ctx.stack, cands, x, labels,
                                                                             self.settings.ntk_loss, pixels))
        self.taus_chosen.append(result.tau)
        return result.weights

    def finish(self, run_dir):
        if not self.is_server:
            return None
        return {"tau_histogram": tau_histogram(self.taus_chosen)}


class CPNTKFL(NTKFL):
    name = "cp-ntk-fl"
    summary = "CP-NTK-FL: NTK-FL with sampling, projection, top-k, shuffling"
    Settings = CPNTKFLSettings
    setting_defaults = {**NTKFL.setting_defaults, "ntk_projection": 200, "ntk_topk": 0.1,
                        "ntk_selection": "linearized"}
    shuffle = True

    def sampling_rate(self) -> float:
        return self.settings.cp_beta
