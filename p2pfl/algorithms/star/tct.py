"""TCT, Train-Convexify-Train (Yu et al. 2022), on the star.

Stage 1 is FedAvg on the network with every client every round. Then the network is convexified: its
head becomes a fresh one-logit layer, and each sample becomes the gradient of that logit over all
trainable parameters, subsampled to p coordinates (p2pfl.ntk.convexified) and standardised with global
statistics gathered in one exchange. Stage 2 fits a linear model to centred one-hot targets by least
squares with SCAFFOLD (Alg. 1 of the paper's appendix): full-batch local gradient steps corrected by
h_k, only the model travelling each way, aggregated with weights n_k/n.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tqdm import tqdm

from p2pfl.algorithms.base import Round
from p2pfl.algorithms.server import ClientWork
from p2pfl.algorithms.server import ServerAlgorithm
from p2pfl.algorithms.star.fedavg import FedAvg, FedAvgSettings
from p2pfl.algorithms.star.linear_stage import Moments, Scalar, StandardFeatures, Standardisation, centred_one_hot
from p2pfl.algorithms.star.linear_stage import check_feature_memory, client_round, feature_memory, feature_notes
from p2pfl.algorithms.star.linear_stage import global_standardisation, largest_curvature, linear_scores, n_space
from p2pfl.algorithms.star.linear_stage import no_standardisation
from p2pfl.comm import Weights
from p2pfl.settings.run_config import machine_memory
from p2pfl.errors import DivergenceError, UserError
from p2pfl.ntk.convexified import entk_features, one_logit_network, subsample_index
from p2pfl.settings.fields import non_negative, option, positive, positive_or_auto
from p2pfl.measure.metrics import declare_metric

declare_metric(
    "stage", "tct_lr", meaning="TCT: the stage (1 FedAvg, 2 linear), the stage-2 learning rate", unit="number"
)

PAPER_LR = 5e-5  # stage 2's local lr in the paper's experiments
AUTO_LR_SHARE = 0.5  # --tct-lr auto: this share of the stability limit 2 / lambda_max


@dataclass(frozen=True)
class TCTSettings:
    tct_stage1_rounds: int = option(100, "stage 1: FedAvg rounds on the network", non_negative)
    tct_stage2_rounds: int = option(100, "stage 2: rounds of the convexified (linear) problem", positive)
    tct_features: int = option(100_000, "p: eNTK coordinates kept (all of them if the network has fewer)", positive)
    tct_local_steps: int = option(500, "M: full-batch local gradient steps per stage-2 round", positive)
    tct_lr: float | str = option(
        PAPER_LR,
        "stage-2 local learning rate (the paper's), or auto: half of 2 / the largest "
        "eigenvalue of the clients' Z^T Z / n_k, estimated by power iteration",
        positive_or_auto,
    )
    tct_seed: int = option(123, "seed of the one-logit head and of the coordinate subset (Alg. 3: 123)", non_negative)
    tct_normalize: bool = option(True, "standardise every eNTK coordinate with global mean and variance")
    tct_stage2: str = option(
        "scaffold", "stage-2 optimiser: scaffold (the paper) or fedavg (TCT-FedAvg)", choices=("scaffold", "fedavg")
    )
    tct_solver: str = option(
        "auto",
        "local steps in n-space (n x n Gram, exact and cheaper when n < p), in p-space, or auto",
        choices=("auto", "n-space", "p-space"),
    )


class TCT(ServerAlgorithm):
    name = "tct"
    products = ("tct_linear.pt",)
    summary = "TCT: FedAvg, then the eNTK-convexified problem solved with SCAFFOLD"
    Settings = TCTSettings
    training = {"lr": 0.01, "batch_size": 64, "local_epochs": 5, "momentum": 0.0, "weight_decay": 1e-5}
    tasks = ("classification",)

    @classmethod
    def rounds(cls, settings, given):
        total = settings.tct_stage1_rounds + settings.tct_stage2_rounds
        if given is not None and given != total:
            raise UserError(
                f"--algo tct runs {total} rounds, set by its own round counts (--tct-stage1-rounds, "
                f"--tct-stage2-rounds); --rounds {given} disagrees"
            )
        return total

    def __init__(self, ctx):
        super().__init__(ctx)
        s = self.settings
        self.fedavg = FedAvg(ctx, FedAvgSettings(clients_per_round=0))  # stage 1: every client, every round
        self.stage1 = s.tct_stage1_rounds
        self.C = ctx.data.n_classes
        self.features, self.grams, self.targets, self.h, self.previous = {}, {}, {}, {}, {}
        self.test_features = self.linear = None
        self.lr = None if s.tct_lr == "auto" else s.tct_lr  # stage 2's; auto: agreed at convexify
        self.convexified_params = self.convexified(torch.zeros(ctx.stack.layout.size))[1].trainable
        check_feature_memory(*self.feature_memory(), *machine_memory(ctx.device))

    def notes(self):
        s, cfg = self.settings, self.ctx.cfg
        return feature_notes(
            cfg.model, s.tct_features, self.convexified_params, self.ctx.stack.layout.trainable, *self.feature_memory()
        )

    def feature_memory(self) -> tuple[int, int]:
        """(samples, bytes) of what stage 2 keeps on this rank: its clients' (the server is a node, not a
        peer) and, on the server's rank, the test samples'."""
        ctx = self.ctx
        tests = (ctx.cfg.test_samples or len(ctx.data.test_x)) if self.is_server else 0
        p = min(self.settings.tct_features, self.convexified_params)
        return feature_memory([len(ctx.shards[c]) for c in ctx.peers], p, self.settings.tct_solver, tests)

    def convexified(self, network: torch.Tensor):
        cfg = self.ctx.cfg
        return one_logit_network(cfg.model, self.ctx.data.input_shape, cfg, network, self.C, self.settings.tct_seed)

    def round(self, round_index) -> Round:
        """Stage 1: a FedAvg round. Stage 2 (convexified first): a linear-stage round, scored with the linear
        model, and not resumable: its features and Grams are not checkpointed (too large)."""
        if round_index < self.stage1:
            result = self.fedavg.round(round_index)
            result.fields["stage"] = 1
            return result
        if round_index == self.stage1:
            self.convexify(round_index)
        losses = self.stage2_round(round_index)
        scores = self.scores() if self.ctx.evaluates(round_index) else None
        return Round(losses, {"stage": 2, "tct_lr": self.lr}, scores=scores, resumable=False)

    # -- convexify ------------------------------------------------------------------------------------
    def convexify(self, round_index: int) -> None:
        """The server sends the stage-1 network to every client; each computes its eNTK features and,
        with normalisation, sends their sums; the server returns the global mean and 1/sd. This one-time
        setup is exchanged reliably under simulated faults (as a protocol that retries until every
        client has answered): statistics from a subset of clients leave the others' features badly
        scaled, and the stage-2 steps diverge."""
        ctx, s = self.ctx, self.settings
        clients = list(range(ctx.cfg.peers))
        network = ctx.global_weights if self.is_server else None
        raw: dict[int, torch.Tensor] = {}
        shown = ctx.transport.rank == 0 and ctx.cfg.progress
        total = self.feature_memory()[0]
        bar = tqdm(total=total, desc="tct: eNTK features", unit="sample", leave=False, disable=not shown)

        def features_of(mine, received):
            out = {}
            for c in mine:
                model, layout, flat = self.convexified(received[c].weights)
                index = subsample_index(layout.trainable, s.tct_features, s.tct_seed)
                raw[c] = entk_features(model, layout, flat, ctx.samples(c)[0], index, done=bar.update)
                out[c] = ClientWork(Moments.of(raw[c]))
            return out

        phases = ("convexify", "normalize")
        got = self.star_round(
            round_index,
            clients,
            download=lambda c: Weights(network),
            work=features_of,
            kinds=(Weights, Moments),
            phases=phases,
            reliable=True,
        ).uploads
        stats = None
        if self.is_server:
            stats = (
                global_standardisation([got[c] for c in clients])
                if s.tct_normalize
                else no_standardisation(len(got[clients[0]].total), ctx.device)
            )
        if s.tct_normalize:  # one more download: the global statistics
            received = self.broadcast("normalize", round_index, clients, lambda c: stats, Standardisation, True)
        else:
            identity = no_standardisation(next(iter(raw.values())).shape[1] if raw else 0, ctx.device)
            received = {c: identity for c in raw}
        for c, z in raw.items():
            self.features[c] = StandardFeatures(z, received[c].mean, received[c].inv_sd)
            self.targets[c] = centred_one_hot(ctx.samples(c)[1], self.C)
            if n_space(s.tct_solver, len(z), z.shape[1]):
                self.grams[c] = self.features[c].gram()
        if self.is_server:
            model, layout, flat = self.convexified(network)
            index = subsample_index(layout.trainable, s.tct_features, s.tct_seed)
            test_x = ctx.data.test_x[: ctx.cfg.test_samples or len(ctx.data.test_x)]
            self.test_features = StandardFeatures(
                entk_features(model, layout, flat, test_x, index, done=bar.update), stats.mean, stats.inv_sd
            )
            self.linear = torch.zeros(len(index) + 1, self.C, device=ctx.device)  # psi^0 = 0, bias last row
        bar.close()
        if s.tct_lr == "auto":
            self.lr = self.agree_on_lr(round_index, clients)

    def agree_on_lr(self, round_index: int, clients: list[int]) -> float:
        """--tct-lr auto: every client sends its lambda_max of Z~^T Z~ / n_k, and the server sends back
        AUTO_LR_SHARE of the stability limit 2 / lambda_max of the largest, one lr for all (reliably, as
        the rest of this setup)."""
        ctx = self.ctx

        def scalar(value):
            return Scalar(torch.tensor([value], dtype=torch.float64, device=ctx.device))

        up = {c: (scalar(largest_curvature(self.features[c], self.grams.get(c))), None) for c in self.features}
        got = self.collect("tct-curvature", round_index, clients, up, Scalar, reliable=True)
        lr = None
        if self.is_server:
            largest = max(float(got[c].value) for c in clients)
            lr = AUTO_LR_SHARE * 2 / largest if largest > 0 else PAPER_LR
        down = self.broadcast("tct-lr", round_index, clients, lambda c: scalar(lr), Scalar, reliable=True)
        return lr if lr is not None else float(next(iter(down.values())).value)

    # -- stage 2 ----------------------------------------------------------------------------------------
    def stage2_round(self, round_index: int) -> torch.Tensor:
        ctx, s = self.ctx, self.settings
        clients = list(range(ctx.cfg.peers))
        shape = (self.test_features.raw.shape[1] + 1, self.C) if self.is_server else None

        steps, scaffold = s.tct_local_steps, s.tct_stage2 == "scaffold"

        def local(mine, received):
            out = {}
            for c in mine:
                Z, Y = self.features[c], self.targets[c]
                theta = received[c].weights.view(Z.raw.shape[1] + 1, self.C)
                residual = Z.matmul(theta) - Y
                h = self.h.get(c, torch.zeros_like(theta))
                W, self.h[c] = client_round(
                    Z, self.grams.get(c), Y, theta, h, self.previous.get(c), self.lr, steps, scaffold, residual
                )
                self.previous[c] = W
                out[c] = ClientWork(Weights(W.reshape(-1)), loss=0.5 * (residual**2).sum(1).mean())
            return out

        done = self.star_round(round_index, clients, download=lambda c: Weights(self.linear.reshape(-1)), work=local)
        got, losses = done.uploads, done.losses  # losses NaN where no download arrived (faults)
        heard = [c for c in clients if c in got]
        if self.is_server and heard:
            p = self.weights_of(heard)
            self.linear = sum(p[i] * got[c].weights for i, c in enumerate(heard)).view(shape)
        if ctx.transport.bcast(bool(not torch.isfinite(self.linear).all()) if self.is_server else None):
            raise DivergenceError(
                f"round {round_index + 1}: the stage-2 linear model holds NaN/inf; the local steps "
                f"are unstable when --tct-lr exceeds 2 / (largest eigenvalue of a client's "
                f"Z^T Z / n_k): lower --tct-lr (now {self.lr:g}), or use --tct-lr auto"
            )
        return losses

    def scores(self) -> tuple[dict, dict]:
        """The linear models' test scores: the server's and every client's last local model (rank 0)."""
        ctx = self.ctx
        y = ctx.data.test_y[: ctx.cfg.test_samples or len(ctx.data.test_y)]
        width = (next(iter(self.features.values())).raw.shape[1] + 1) * self.C  # every client has features
        zero = torch.zeros(width, device=ctx.device)  # a client no stage-2 download has reached (faults)
        mine = torch.stack([self.previous[c].reshape(-1) if c in self.previous else zero for c in ctx.peers])
        clients = ctx.transport.gather_rows(mine)
        if not self.is_server:
            return {}, {}
        return linear_scores(self.test_features, self.linear, clients.view(len(clients), *self.linear.shape), y)

    def finish(self, run_dir):
        if run_dir is not None and self.linear is not None:
            model = {"weight": self.linear[:-1].T.contiguous().cpu(), "bias": self.linear[-1].cpu()}
            torch.save(model, run_dir / "tct_linear.pt")
        return None
