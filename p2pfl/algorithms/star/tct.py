"""TCT, Train-Convexify-Train (Yu et al. 2022), on the star.

Stage 1 is FedAvg on the network with every client every round. Then the network is convexified: its
head becomes a fresh one-logit layer, and each sample becomes the gradient of that logit over all
trainable parameters, subsampled to p coordinates (p2pfl.ntk.entk) and standardised with global
statistics gathered in one exchange. Stage 2 fits a linear model to centred one-hot targets by least
squares with SCAFFOLD (Alg. 1 of the paper's appendix): full-batch local gradient steps corrected by
h_k, only the model travelling each way, aggregated with weights n_k/n.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from tqdm import tqdm

from p2pfl.algorithms.star.fedavg import FedAvg
from p2pfl.options import non_negative, option, positive, positive_or_auto
from p2pfl.comm import Message, Payload, Weights
from p2pfl.config import machine_memory
from p2pfl.errors import DivergenceError, UserError
from p2pfl.ntk.entk import entk_features, one_logit_network, subsample_index

PAPER_LR = 5e-5  # stage 2's local lr in the paper's experiments
AUTO_LR_SHARE = 0.5  # --tct-lr auto: this share of the stability limit 2 / lambda_max
POWER_ITERATIONS = 30  # for each client's lambda_max (an estimate from below: the share leaves room)
FEATURE_WORKING_SET = 2 * 2**30  # the per-sample gradients entk_features holds for a chunk (its memory_gb)


@dataclass(frozen=True)
class TCTSettings:
    tct_stage1_rounds: int = option(100, "stage 1: FedAvg rounds on the network", non_negative)
    tct_stage2_rounds: int = option(100, "stage 2: rounds of the convexified (linear) problem", positive)
    tct_features: int = option(100_000, "p: eNTK coordinates kept (all of them if the network has fewer)", positive)
    tct_local_steps: int = option(500, "M: full-batch local gradient steps per stage-2 round", positive)
    tct_lr: float | str = option(PAPER_LR, "stage-2 local learning rate (the paper's), or auto: half of 2 / the largest "
                                 "eigenvalue of the clients' Z^T Z / n_k, estimated by power iteration",
                                 positive_or_auto)
    tct_seed: int = option(123, "seed of the one-logit head and of the coordinate subset (Alg. 3: 123)",
                           non_negative)
    tct_normalize: bool = option(True, "standardise every eNTK coordinate with global mean and variance")
    tct_stage2: str = option("scaffold", "stage-2 optimiser: scaffold (the paper) or fedavg (TCT-FedAvg)",
                             choices=("scaffold", "fedavg"))
    tct_solver: str = option("auto", "local steps in n-space (n x n Gram, exact and cheaper when n < p), in "
                             "p-space, or auto", choices=("auto", "n-space", "p-space"))


@dataclass
class Moments(Payload):
    """A client's feature sums for the global standardisation."""

    total: torch.Tensor  # (p,) float64
    squares: torch.Tensor  # (p,) float64
    count: torch.Tensor  # (1,) float64

    @classmethod
    def of(cls, raw: torch.Tensor, block_bytes: int = 2**28) -> "Moments":
        """The sums of raw features (n, p) and of their squares, in float64 a block of rows at a time: the
        whole in float64 would be an n x p transient (9.6 GB for 6,000 images at p = 100,000), twice."""
        total = torch.zeros(raw.shape[1], dtype=torch.float64, device=raw.device)
        squares = torch.zeros_like(total)
        rows = max(1, block_bytes // (8 * max(1, raw.shape[1])))
        for s in range(0, len(raw), rows):
            z = raw[s:s + rows].double()
            total += z.sum(0)
            squares += (z * z).sum(0)
        return cls(total, squares, torch.tensor([float(len(raw))], dtype=torch.float64, device=raw.device))


@dataclass
class Scalar(Payload):
    """One number: a client's curvature going up, the stage-2 lr coming down (--tct-lr auto)."""

    value: torch.Tensor  # (1,) float64


@dataclass
class Standardisation(Payload):
    mean: torch.Tensor  # (p,)
    inv_sd: torch.Tensor  # (p,)


def global_standardisation(moments: list[Moments]) -> Standardisation:
    """Every coordinate's mean and 1/sd over all clients' samples (1 where the sd vanishes)."""
    total, squares, count = (sum(getattr(m, f) for m in moments) for f in ("total", "squares", "count"))
    mean = total / count
    sd = (squares / count - mean * mean).clamp_min(0).sqrt()
    inv_sd = torch.where(sd > 1e-8, 1 / sd.clamp_min(1e-8), torch.ones_like(sd))
    return Standardisation(mean.float(), inv_sd.float())


def no_standardisation(p: int, device) -> Standardisation:
    """--no-tct-normalize: the features as they are."""
    return Standardisation(torch.zeros(p, device=device), torch.ones(p, device=device))


class StandardFeatures:
    """Z~ = [(Z - mean) * inv_sd, 1] (the 1 is the bias column), kept as the raw float16 Z: products
    are taken in float32 a block of rows at a time, standardised in place in one reused buffer, so Z~
    is never held in float32 and no block is allocated twice."""

    def __init__(self, raw: torch.Tensor, mean: torch.Tensor, inv_sd: torch.Tensor, block: int = 256):
        self.raw, self.mean, self.inv_sd = raw, mean, inv_sd
        self.block = min(block, max(1, len(raw)))
        self.buffers = [torch.empty(self.block, raw.shape[1], device=raw.device) for _ in range(2)]

    def __len__(self) -> int:
        return len(self.raw)

    def blocks(self, which: int = 0):
        """(start, stop, standardised rows without the bias column), the rows in buffers[which]."""
        for s in range(0, len(self.raw), self.block):
            e = min(s + self.block, len(self.raw))
            z = self.buffers[which][: e - s]
            z.copy_(self.raw[s:e]).sub_(self.mean).mul_(self.inv_sd)
            yield s, e, z

    def matmul(self, W: torch.Tensor) -> torch.Tensor:
        """Z~ W: (n, C) from W (p + 1, C)."""
        out = torch.empty(len(self.raw), W.shape[1], device=W.device)
        for s, e, z in self.blocks():
            torch.matmul(z, W[:-1], out=out[s:e])
        return out.add_(W[-1])

    def t_matmul(self, A: torch.Tensor) -> torch.Tensor:
        """Z~^T A: (p + 1, C) from A (n, C)."""
        out = torch.zeros(self.raw.shape[1] + 1, A.shape[1], device=A.device)
        for s, e, z in self.blocks():
            out[:-1].addmm_(z.T, A[s:e])
        out[-1] = A.sum(0)
        return out

    def gram(self) -> torch.Tensor:
        """Z~ Z~^T (n, n)."""
        out = torch.ones(len(self.raw), len(self.raw), device=self.raw.device)
        for s, e, zi in self.blocks(0):
            for t, f, zj in self.blocks(1):
                out[s:e, t:f].addmm_(zi, zj.T)
        return out


def centred_one_hot(y: torch.Tensor, classes: int) -> torch.Tensor:
    """Alg. 2's targets: one-hot minus 1/C."""
    return torch.nn.functional.one_hot(y.long(), classes).float() - 1.0 / classes


def local_steps_p_space(Z: StandardFeatures, Y, theta, h, lr: float, steps: int) -> torch.Tensor:
    """M steps of W <- W - lr ((1/n) Z~^T (Z~ W - Y) - h) from W = theta."""
    W = theta.clone()
    for _ in range(steps):
        W -= lr * (Z.t_matmul(Z.matmul(W) - Y) / len(Y) - h)
    return W


def local_steps_n_space(Z: StandardFeatures, gram: torch.Tensor, Y, theta, h, lr: float, steps: int,
                        u: torch.Tensor | None = None) -> torch.Tensor:
    """The same M steps, exactly, with the iterate written W_m = theta + m lr h + Z~^T A_m: then
    A_{m+1} = A_m - (lr/n) (u + m lr v + G A_m) with u = Z~ theta - Y (pass it if already computed),
    v = Z~ h and G = Z~ Z~^T, so a step costs O(n^2 C) instead of O(n p C)."""
    n = len(Y)
    u = Z.matmul(theta) - Y if u is None else u
    v = Z.matmul(h)
    A = torch.zeros_like(u)
    for m in range(steps):
        A -= (lr / n) * (u + (m * lr) * v + gram @ A)
    return theta + (steps * lr) * h + Z.t_matmul(A)


def largest_curvature(Z: StandardFeatures, gram: torch.Tensor | None, iterations: int = POWER_ITERATIONS) -> float:
    """lambda_max of Z~^T Z~ / n by power iteration: on the Gram Z~ Z~^T / n where the client keeps it
    (the same nonzero eigenvalues, n x n instead of p x p), else through the features."""
    n = len(Z)
    size = n if gram is not None else Z.raw.shape[1] + 1
    v = torch.randn(size, 1, generator=torch.Generator().manual_seed(0)).to(Z.raw.device)
    value = 0.0
    for _ in range(iterations):
        v = (gram @ v if gram is not None else Z.t_matmul(Z.matmul(v))) / n
        value = float(v.norm())
        if value == 0:
            return 0.0
        v /= value
    return value


def client_round(Z: StandardFeatures, gram: torch.Tensor | None, Y, theta, h, previous, lr: float, steps: int,
                 scaffold: bool = True, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One client's stage-2 round (the paper's Alg. 1): eq. (2) h_k += (theta - previous) / (M lr), where
    previous is its last local model (none in its first round: h stays 0), then eq. (3), M full-batch
    steps corrected by h_k; in n-space when its Gram matrix is given (reusing residual = Z~ theta - Y
    if the caller has it). Returns (new local model, h_k)."""
    if scaffold and previous is not None:
        h = h + (theta - previous) / (steps * lr)
    if gram is not None:
        return local_steps_n_space(Z, gram, Y, theta, h, lr, steps, residual), h
    return local_steps_p_space(Z, Y, theta, h, lr, steps), h


class TCT(FedAvg):
    name = "tct"
    summary = "TCT: FedAvg, then the eNTK-convexified problem solved with SCAFFOLD"
    Settings = TCTSettings
    training = {"lr": 0.01, "batch_size": 64, "local_epochs": 5, "momentum": 0.0, "weight_decay": 1e-5}
    tasks = ("classification",)
    round_flags = ("--tct-stage1-rounds", "--tct-stage2-rounds")

    @classmethod
    def fixed_rounds(cls, settings) -> int:
        return settings.tct_stage1_rounds + settings.tct_stage2_rounds

    def __init__(self, ctx):
        super().__init__(ctx)
        s = self.settings
        self.stage1 = s.tct_stage1_rounds
        self.stage = 1
        self.C = ctx.data.n_classes
        self.features, self.grams, self.targets, self.h, self.previous = {}, {}, {}, {}, {}
        self.test_features = self.linear = None
        self.lr = None if s.tct_lr == "auto" else s.tct_lr  # stage 2's; auto: agreed at convexify
        self.convexified_params = self.convexified(torch.zeros(ctx.stack.layout.size))[1].trainable
        self.check_feature_memory()

    def sgd(self):
        return self.ctx.sgd()  # stage 1 is plain FedAvg: --local-epochs of minibatch SGD

    def notes(self):
        s, cfg = self.settings, self.ctx.cfg
        network = self.ctx.stack.layout.trainable
        total = self.convexified_params
        if s.tct_features >= total:
            kept = (f"tct: the convexified {cfg.model} has {total:,} parameters (head of 1 logit), not more than "
                    f"--tct-features {s.tct_features:,}: all of them are kept, no subsampling")
        else:
            kept = (f"tct: eNTK features: {s.tct_features:,} of the convexified {cfg.model}'s {total:,} parameters "
                    f"(the network has {network:,})")
        samples, need = self.feature_memory()
        return [kept, f"tct: stage 2 holds the features of {samples:,} samples on the busiest rank: about "
                      f"{need / 2**30:.1f} GiB (n x p x 2 bytes, with the Grams where n < p and the server's test "
                      f"features); --train-samples and --tct-features shrink it"]

    def feature_memory(self) -> tuple[int, int]:
        """(samples, bytes) of what stage 2 keeps on this rank: each client's float16 features (n_k x p),
        its float32 Gram where it steps in n-space, the server's test features, and the computation's
        working set."""
        ctx = self.ctx
        p = min(self.settings.tct_features, self.convexified_params)
        sizes = [len(ctx.shards[c]) for c in ctx.peers]  # the rank's clients (the server is a node, not a peer)
        need = sum(2 * n * p + (4 * n * n if self.n_space(n, p) else 0) for n in sizes)
        samples = sum(sizes)
        if self.is_server:
            tests = ctx.cfg.test_samples or len(ctx.data.test_x)
            need, samples = need + 2 * tests * p, samples + tests
        return samples, need + FEATURE_WORKING_SET

    def check_feature_memory(self) -> None:
        """Refuse, before stage 1 is spent, a run whose stage-2 features cannot fit this machine."""
        samples, need = self.feature_memory()
        where, have = machine_memory(self.ctx.device)
        if need > have:
            raise UserError(f"tct: the eNTK features of {samples:,} samples would take about {need / 2**30:,.1f} GiB "
                            f"on one rank, more than {where}'s {have / 2**30:,.1f} GiB: use --train-samples (fewer "
                            "samples), --tct-features (fewer coordinates) or more ranks")

    def convexified(self, network: torch.Tensor):
        cfg = self.ctx.cfg
        return one_logit_network(cfg.model, self.ctx.data.input_shape, cfg, network, self.C, self.settings.tct_seed)

    def row_fields(self, round_index):
        if round_index < self.stage1:
            return {"stage": 1}
        return {"stage": 2, "tct_lr": self.lr}  # what --tct-lr auto chose, where it did

    def resumable_after(self, rounds_done):
        return rounds_done <= self.stage1  # stage 2's features and Grams are not checkpointed (too large)

    def round(self, round_index):
        if round_index < self.stage1:
            return super().round(round_index)
        if round_index == self.stage1:
            self.convexify(round_index)
        self.stage = 2
        return self.stage2_round(round_index)

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
        bar = tqdm(total=self.feature_memory()[0], desc="tct: eNTK features", unit="sample", leave=False,
                   disable=ctx.transport.rank != 0 or not ctx.cfg.progress)

        def features_of(mine, received):
            out = {}
            for c in mine:
                model, layout, flat = self.convexified(received[c].weights)
                index = subsample_index(layout.trainable, s.tct_features, s.tct_seed)
                raw[c] = entk_features(model, layout, flat, ctx.samples(c)[0], index, done=bar.update)
                out[c] = (Moments.of(raw[c]), None)
            return out

        phases = ("convexify", "normalize")
        got = self.star_round(round_index, clients, lambda c: Weights(network), features_of, Weights, Moments,
                              phases, reliable=True)
        stats = None
        if self.is_server:
            stats = global_standardisation([got[c] for c in clients]) if s.tct_normalize else \
                no_standardisation(len(got[clients[0]].total), ctx.device)
        if s.tct_normalize:  # one more download: the global statistics
            msgs = [Message(self.server, c, stats) for c in clients] if self.is_server else []
            inbox = ctx.transport.exchange("normalize", round_index, msgs, [(self.server, c) for c in raw],
                                           Standardisation, reliable=True)
            received = {c: inbox[c][self.server] for c in raw}
        else:
            identity = no_standardisation(next(iter(raw.values())).shape[1] if raw else 0, ctx.device)
            received = {c: identity for c in raw}
        for c, z in raw.items():
            self.features[c] = StandardFeatures(z, received[c].mean, received[c].inv_sd)
            self.targets[c] = centred_one_hot(ctx.samples(c)[1], self.C)
            if self.n_space(len(z), z.shape[1]):
                self.grams[c] = self.features[c].gram()
        if self.is_server:
            model, layout, flat = self.convexified(network)
            index = subsample_index(layout.trainable, s.tct_features, s.tct_seed)
            test_x = ctx.data.test_x[: ctx.cfg.test_samples or len(ctx.data.test_x)]
            self.test_features = StandardFeatures(entk_features(model, layout, flat, test_x, index, done=bar.update),
                                                  stats.mean, stats.inv_sd)
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

        up = [Message(c, self.server, scalar(largest_curvature(self.features[c], self.grams.get(c))))
              for c in self.features]
        inbox = ctx.transport.exchange("tct-curvature", round_index, up,
                                       [(c, self.server) for c in clients] if self.is_server else [], Scalar,
                                       reliable=True)
        lr = None
        if self.is_server:
            largest = max(float(inbox[self.server][c].value) for c in clients)
            lr = AUTO_LR_SHARE * 2 / largest if largest > 0 else PAPER_LR
        down = [Message(self.server, c, scalar(lr)) for c in clients] if self.is_server else []
        inbox = ctx.transport.exchange("tct-lr", round_index, down, [(self.server, c) for c in self.features],
                                       Scalar, reliable=True)
        return lr if lr is not None else float(next(iter(inbox.values()))[self.server].value)

    def n_space(self, n: int, p: int) -> bool:
        solver = self.settings.tct_solver
        return solver == "n-space" or (solver == "auto" and n < p)

    # -- stage 2 ----------------------------------------------------------------------------------------
    def stage2_round(self, round_index: int) -> torch.Tensor:
        ctx, s = self.ctx, self.settings
        clients = list(range(ctx.cfg.peers))
        losses = torch.full((len(ctx.peers),), math.nan, device=ctx.device)  # NaN: no download (faults)
        shape = (self.test_features.raw.shape[1] + 1, self.C) if self.is_server else None

        def local(mine, received):
            out = {}
            for c in mine:
                Z, Y = self.features[c], self.targets[c]
                theta = received[c].weights.view(Z.raw.shape[1] + 1, self.C)
                residual = Z.matmul(theta) - Y
                losses[self.row[c]] = 0.5 * (residual**2).sum(1).mean()
                W, self.h[c] = client_round(Z, self.grams.get(c), Y, theta, self.h.get(c, torch.zeros_like(theta)),
                                            self.previous.get(c), self.lr, s.tct_local_steps,
                                            s.tct_stage2 == "scaffold", residual)
                self.previous[c] = W
                out[c] = (Weights(W.reshape(-1)), None)
            return out

        got = self.star_round(round_index, clients, lambda c: Weights(self.linear.reshape(-1)), local,
                              Weights, Weights)
        heard = [c for c in clients if c in got]
        if self.is_server and heard:
            p = self.weights_of(heard)
            self.linear = sum(p[i] * got[c].weights for i, c in enumerate(heard)).view(shape)
        if ctx.transport.bcast(bool(not torch.isfinite(self.linear).all()) if self.is_server else None):
            raise DivergenceError(f"round {round_index + 1}: the stage-2 linear model holds NaN/inf; the local steps "
                                  f"are unstable when --tct-lr exceeds 2 / (largest eigenvalue of a client's "
                                  f"Z^T Z / n_k): lower --tct-lr (now {self.lr:g}), or use --tct-lr auto")
        return losses

    def test_scores(self, x, y):
        if self.stage == 1:
            return None
        ctx = self.ctx
        width = (next(iter(self.features.values())).raw.shape[1] + 1) * self.C  # every client has features
        zero = torch.zeros(width, device=ctx.device)  # a client no stage-2 download has reached (faults)
        mine = torch.stack([self.previous[c].reshape(-1) if c in self.previous else zero for c in ctx.peers])
        clients = ctx.transport.gather_rows(mine)
        if not self.is_server:
            return {}, {}
        models = torch.cat([self.linear[None], clients.view(len(clients), *self.linear.shape)])
        out = self.test_features.matmul(torch.cat(list(models), 1)).view(len(x), len(models), self.C)
        target = centred_one_hot(y, self.C)
        acc = (out.argmax(2) == y[:, None]).double().mean(0)
        loss = 0.5 * ((out - target[:, None]) ** 2).sum(2).double().mean(0)
        return {"acc": float(acc[0]), "loss": float(loss[0])}, {"acc": acc[1:], "loss": loss[1:]}

    def finish(self, run_dir):
        if run_dir is not None and self.linear is not None:
            torch.save({"weight": self.linear[:-1].T.contiguous().cpu(), "bias": self.linear[-1].cpu()},
                       run_dir / "tct_linear.pt")
        return None
