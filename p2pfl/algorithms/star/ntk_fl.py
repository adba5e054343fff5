"""NTK-FL and CP-NTK-FL (Yue et al., ICML 2022) on the star.

NTK-FL: the sampled clients send the Jacobians of their samples at the broadcast weights, with labels
and outputs; the server builds the kernel of all of them, evolves, keeps the best candidate t and
replaces the global model (the same NTK step as NTK-DFL, at the hub).

CP-NTK-FL adds: each client uses a fraction beta of its samples each round (--cp-beta), inputs are
projected with a shared-seed Gaussian matrix (--ntk-projection, the model's input size becomes d1';
the test set is projected too), Jacobians are top-k sparsified (--ntk-topk), and a shuffling server
permutes the (J, f, Y) rows jointly before the aggregator sees them (the update does not change:
tests check it).

Both pick t by the true network's loss at each candidate on the round's training samples (eq. 11a, as
the reference code; a simulator shortcut: the server reads those inputs from the shared dataset copy,
which the clients do not upload). --ntk-selection validation is the paper's alternative for a server
without them: the loss on the samples of --ntk-validation-clients held-out clients, which are never
sampled for training. 'linearized' (the evolved outputs' loss) falls with t (Remark 1) and so always
takes the largest candidate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from p2pfl.algorithms.base import Round
from p2pfl.algorithms.ntk_options import NTKOptions, compile_ahead, make_codec, project_inputs
from p2pfl.algorithms.server import ClientWork, ServerAlgorithm, ServerOptions, clients_per_round
from p2pfl.errors import UserError
from p2pfl.settings.fields import fraction, option, positive
from p2pfl.comm import Payload
from p2pfl.measure.metrics import declare_metric
from p2pfl.measure.facts import histogram
from p2pfl.ntk.plan import PlanError, check_memory
from p2pfl.ntk.pixels import PixelInputs
from p2pfl.ntk.step import ntk_step
from p2pfl.local.forward import candidate_losses

declare_metric("ntk_t", meaning="NTK-FL, CP-NTK-FL: the evolution time t the server chose this round", unit="steps")


@dataclass(frozen=True)
class NTKFLSettings(ServerOptions, NTKOptions):
    ntk_validation_clients: int = option(
        15,
        "with --ntk-selection validation: clients held out of training whose samples the server selects t on",
        positive,
    )


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
    state = {"taus_chosen": "pooled"}

    def __init__(self, ctx):
        super().__init__(ctx)
        self.step_settings = self.settings.step_settings()
        self.codec = make_codec(ctx, self.settings)
        compile_ahead(ctx, self.settings)
        self.beta = self.sampling_rate()
        self.taus_chosen: list[int] = []
        self.held_out = self.validation_clients()
        if self.held_out and self.is_server:  # their samples on the server's device, once
            self.validation = ctx.rows(torch.cat([ctx.shards[c] for c in self.held_out]))
        largest = sorted(len(s) for s in ctx.shards)[-self.per_round :]
        held = sum(math.ceil(self.beta * n) for n in largest)
        try:
            check_memory(self.codec, self.settings.ntk_memory_gb, ctx.data.n_classes, held)
        except PlanError as exc:
            raise UserError(str(exc)) from None

    @classmethod
    def prepare_data(cls, data, cfg):
        project_inputs(data, cfg)

    @classmethod
    def check(cls, cfg) -> None:
        s = cfg.settings
        if s.ntk_selection == "own":
            raise UserError(
                f"--ntk-selection own is NTK-DFL's (a peer's own samples); {cls.name} has network, "
                "linearized or validation"
            )
        if s.ntk_selection == "validation" and clients_per_round(s, cfg.peers) > cfg.peers - s.ntk_validation_clients:
            raise UserError(
                f"--ntk-validation-clients {s.ntk_validation_clients} held out of {cfg.peers} clients "
                f"leaves fewer than the {clients_per_round(s, cfg.peers)} sampled each round; hold out fewer, "
                "or sample fewer (--clients-per-round)"
            )

    def validation_clients(self) -> list[int]:
        """The held-out clients of --ntk-selection validation (seeded; none for the other rules)."""
        if self.settings.ntk_selection != "validation":
            return []
        rng = self.ctx.rng("validation-clients")
        return sorted(rng.choice(self.ctx.cfg.peers, self.settings.ntk_validation_clients, replace=False).tolist())

    def sample(self, round_index: int) -> list[int]:
        """The round's clients, from those not held out for validation."""
        if not self.held_out:
            return super().sample(round_index)
        pool = np.setdiff1d(np.arange(self.ctx.cfg.peers), self.held_out)
        rng = self.ctx.rng("clients", round_index)
        return sorted(pool[rng.choice(len(pool), self.per_round, replace=False)].tolist())

    def sampling_rate(self) -> float:
        """The fraction of its samples a client uses each round (CP-NTK-FL's beta)."""
        return 1.0

    def samples(self, round_index: int, client: int) -> torch.Tensor:
        shard = self.ctx.shards[client].numpy()
        if self.beta < 1:
            keep = max(1, int(round(self.beta * len(shard))))
            shard = np.sort(self.ctx.rng("cp-sample", round_index, client).choice(shard, keep, False))
        return torch.from_numpy(shard)

    def client_work(self, round_index, clients, received):
        ctx, out = self.ctx, {}
        for c in clients:
            index = self.samples(round_index, c)
            x, y = ctx.rows(index)
            jac, f = self.codec.compute(received[c].weights, x)
            upload = NTKUpload(f.detach(), y, index, self.codec.to_wire(jac))
            out[c] = ClientWork(upload, model=received[c].weights, dense=self.codec.dense_bytes(f, y))
        return out

    def server_update(self, round_index, clients, uploads):
        ctx, w = self.ctx, self.ctx.global_weights
        parts = [self.codec.read(uploads[c].jacobian, uploads[c].outputs, uploads[c].labels) for c in clients]
        # the inputs as pixel codes where they are pixels: the factored products in integer arithmetic
        pixels = (
            PixelInputs.cat([PixelInputs.encode(p[0].acts[0], ctx.data.pixel_levels) for p in parts])
            if self.codec.path == "factored"
            else None
        )
        jac = self.codec.cat([p[0] for p in parts], pixels=pixels)
        f0 = torch.cat([p[1] for p in parts])
        labels = torch.cat([p[2] for p in parts])
        index = torch.cat([uploads[c].index for c in clients])
        if self.shuffle:
            order = torch.randperm(len(labels), generator=ctx.generator("shuffler", round_index))
            jac, f0, labels, index = jac.rows(order.to(f0.device)), f0[order], labels[order], index[order]
        x, y, pixels = ctx.rows(index)[0], labels, getattr(jac, "pixels", None)
        if self.held_out:  # the held-out clients' samples instead of the round's (eq. 11a's alternative)
            (x, y), pixels = self.validation, None
        result = ntk_step(
            jac,
            self.codec.shape,
            w,
            f0,
            labels,
            ctx.data.n_classes,
            ctx.lr(round_index),
            self.step_settings,
            lambda cands: candidate_losses(ctx.stack, cands, x, y, self.settings.ntk_loss, pixels),
        )
        self.taus_chosen.append(result.tau)
        return result.weights

    def round(self, round_index) -> Round:
        """ServerAlgorithm's round; the row's ntk_t is the t the server chose (none where it heard no client)."""
        chosen = len(self.taus_chosen)
        result = super().round(round_index)
        if len(self.taus_chosen) > chosen:
            result.fields["ntk_t"] = self.taus_chosen[-1]
        return result

    def finish(self, run_dir):
        if not self.is_server:
            return None
        return {"tau_histogram": histogram(self.taus_chosen)}


class CPNTKFL(NTKFL):
    name = "cp-ntk-fl"
    summary = "CP-NTK-FL: NTK-FL with sampling, projection, top-k, shuffling"
    Settings = CPNTKFLSettings
    # top-k 0.78%: the paper's Table 1 uplink (386 MiB over 26 rounds x 20 clients = 0.742 MiB an upload)
    # over a kept entry's 8 bytes (fp32 value, int32 index) of its dense projected Jacobian (60 samples x
    # 10 classes x 21,110 weights = 12.7M entries); the paper does not state k
    setting_defaults = {**NTKFL.setting_defaults, "ntk_projection": 200, "ntk_topk": 0.0078}
    shuffle = True

    def sampling_rate(self) -> float:
        return self.settings.cp_beta
