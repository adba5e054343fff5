"""FedAvg with fine-tuning (Collins et al. 2022): FedAvg's local steps learn a shared representation,
which a new client then fine-tunes. --local-steps 1 is the paper's D-GD / D-SGD baseline.

Two tracks, chosen by the dataset:
- linear-rep (section 5.1): y = <B* w*_i, x>; local steps are simultaneous gradient steps on (B, w),
  with population gradients (exact, the paper's figures) or full-batch gradients of the client's
  samples. Each round logs dist(B_t, B*) and the norm of the global loss's gradient; after training,
  new clients fine-tune (B, w) by full-batch GD on n fresh samples, error ||B w - B* w*||^2 against n.
- an image dataset (section 5.2): the last --ft-held-out-classes classes are kept out of training;
  after training, new clients holding only those classes fine-tune the whole network for
  --ft-epochs epochs on n samples, and the class-pair cosine similarity of the trained network's
  penultimate features is drawn (the paper's fig. 4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from p2pfl.algorithms.base import Round
from p2pfl.algorithms.star.fedavg import FedAvg, FedAvgSettings
from p2pfl.settings.fields import non_negative, option, positive, positive_ints
from p2pfl.errors import UserError
from p2pfl.measure.figures import plot_fine_tuning, plot_linear_run, plot_similarity
from p2pfl.local.training import SGDSettings
from p2pfl.local.forward import evaluate
from p2pfl.measure.metrics import declare_metric

declare_metric(
    "rep_dist",
    "grad_norm",
    meaning="FedAvg-FT on linear-rep: principal-angle distance of the representation to the true one; the norm "
    "of the round's global gradient",
    unit="number",
)


@dataclass(frozen=True)
class FedAvgFTSettings(FedAvgSettings):
    ft_gradients: str = option(
        "population",
        "linear-rep: local gradients of the population loss (exact) or of the client's samples (full batch)",
        choices=("population", "samples"),
    )
    ft_new_samples: tuple[int, ...] = option(
        (10, 20, 50, 100, 200), "n: a new client's fine-tuning samples (a comma-separated grid)", positive_ints
    )
    ft_lr: float = option(
        0.0, "step size of the fine-tuning (0: the training --lr, as the paper's eq. 4)", non_negative
    )
    ft_steps: int = option(200, "linear-rep: full-batch GD steps of a new client's fine-tuning", positive)
    ft_epochs: int = option(10, "networks: SGD epochs of a new client's fine-tuning", positive)
    ft_trials: int = option(10, "fine-tuning trials (each draws new clients and their samples)", positive)
    ft_new_clients: int = option(1, "new clients per trial", positive)
    ft_held_out_classes: int = option(
        2, "networks: the last classes kept out of training for the new clients", non_negative
    )


def principal_angle_distance(B: torch.Tensor, B_star: torch.Tensor) -> float:
    """dist(B, B*) = ||(I - Q Q^T) Q*||_2 with Q, Q* orthonormal bases of col(B), col(B*): the sine of
    the largest principal angle (the paper's Definition 2)."""
    q, _ = torch.linalg.qr(B.double())
    q_star, _ = torch.linalg.qr(B_star.double())
    value = float(torch.linalg.matrix_norm(q_star - q @ (q.T @ q_star), ord=2))
    return float(f"{value:.10g}")  # LAPACK's last bits depend on its thread count, i.e. on the launch


def summarise(values: dict[int, list[float]]) -> dict[str, dict]:
    """Per n: mean and std over the finite values, and how many diverged (NaN/inf: fine-tuning steps
    too large for so few samples; lower --ft-lr)."""
    out = {}
    for n, v in values.items():
        finite = [x for x in v if math.isfinite(x)]
        out[str(n)] = {
            "mean": float(np.mean(finite)) if finite else None,
            "std": float(np.std(finite)) if finite else None,
            "diverged": len(v) - len(finite),
        }
    return out


def residuals(X: torch.Tensor, y: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """<beta, x_j> - y_j, as elementwise products and row sums: unlike a BLAS product, the summation
    order does not depend on the thread count, so every launch gives the same bits."""
    return (X * beta).sum(1) - y


def sample_gradient(X: torch.Tensor, y: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """The gradient in beta of 1/(2n) sum_j (<beta, x_j> - y_j)^2."""
    return (X * residuals(X, y, beta)[:, None]).sum(0) / len(y)


def betas(B: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """beta = B w for rows of peers, B (L, d, k), w (L, k), as products and sums: each row's bits do
    not depend on which other rows are in the batch (a batched BLAS product's can), so a run gives
    the same numbers on any number of ranks."""
    return (B * w[:, None, :]).sum(2)


def linear_gd(
    B: torch.Tensor, w: torch.Tensor, residual_gradient, lr: float, steps: int, first: torch.Tensor | None = None
):
    """Simultaneous gradient steps on (B, w) of rows of peers, B (L, d, k), w (L, k): with g the gradient
    of the loss in beta = B w, grad_B = g w^T and grad_w = B^T g (as products and sums, as betas), both at
    the same iterate. `first` is g at the start, where the caller has it already."""
    g = residual_gradient(B, w) if first is None else first
    for step in range(steps):
        if step:
            g = residual_gradient(B, w)
        B, w = B - lr * g[:, :, None] * w[:, None, :], w - lr * (B * g[:, :, None]).sum(1)
    return B, w


class FedAvgFT(FedAvg):
    name = "fedavg-ft"
    withstands_threats = False  # its fine-tuning stage is not a server average: not the average the threats act on
    private_training = False
    products = ("rep_dist.png", "grad_norm.png", "finetune_error.png", "fine_tuning.png", "feature_similarity.png")
    summary = "FedAvg with fine-tuning: local steps learn a representation; new clients fine-tune it"
    Settings = FedAvgFTSettings
    setting_defaults = {"clients_per_round": 0, "local_steps": 2}
    training = {"lr": 0.1, "batch_size": 50, "local_epochs": 1, "momentum": 0.0}
    state = {"history": "server"}  # the rep_dist and grad_norm curve its figures draw

    @classmethod
    def prepare_data(cls, data, cfg):
        held = cfg.settings.ft_held_out_classes
        if data.task != "classification" or not held:
            return
        if held >= data.n_classes:
            raise UserError(
                f"--ft-held-out-classes {held} leaves no class of {data.name}'s {data.n_classes} to train on"
            )
        first_new = data.n_classes - held
        train, test = data.train_y >= first_new, data.test_y >= first_new
        data.held_out = {
            "x": data.train_x[train],
            "y": data.train_y[train],
            "test_x": data.test_x[test],
            "test_y": data.test_y[test],
            "classes": list(range(first_new, data.n_classes)),
            "all_test_x": data.test_x,
            "all_test_y": data.test_y,
        }
        data.select_training((~train).numpy())
        data.test_x, data.test_y = data.test_x[~test], data.test_y[~test]

    def __init__(self, ctx):
        super().__init__(ctx)
        self.truth = ctx.data.truth
        self.history: list[dict] = []
        if self.truth is not None:
            self.B_star, self.w_star = self.truth["B"], self.truth["w"]  # on the run's device (Dataset.to)
            if self.is_server:  # the theorem's start: sqrt(lr) B0 orthonormal, w0 = 0
                views = ctx.stack.layout.views(ctx.global_weights)
                q, _ = torch.linalg.qr(torch.randn(views["B"].shape, generator=ctx.generator("B0")))
                views["B"].copy_(q / math.sqrt(ctx.cfg.lr))  # copy_ moves it to the run's device
                views["w"].zero_()

    # -- training -------------------------------------------------------------------------------------
    def local_train(self, round_index, clients, received, terms=None):
        if self.truth is None:
            return super().local_train(round_index, clients, received, terms)
        ctx = self.ctx
        start = torch.stack([received[c].weights for c in clients])
        views = ctx.stack.layout.views(start)
        grad = self.residual_gradient(clients)
        g0 = grad(views["B"], views["w"])
        B, w = linear_gd(views["B"], views["w"], grad, ctx.lr(round_index), self.settings.local_steps or 1, g0)
        trained = torch.cat([B.reshape(len(clients), -1), w], 1)
        losses = torch.stack(
            [torch.as_tensor(self.client_loss(c, views["B"][i], views["w"][i], g0[i])) for i, c in enumerate(clients)]
        )
        return trained, losses

    def residual_gradient(self, clients):
        """g(B, w): the gradient of each client's loss in beta = B w, population or full-batch."""
        ctx = self.ctx
        if self.settings.ft_gradients == "population":  # f_i = 1/2 ||B w - B* w*_i||^2
            targets = (self.B_star * self.w_star[clients][:, None, :]).sum(2)
            return lambda B, w: betas(B, w) - targets
        X, y = zip(*(ctx.samples(c) for c in clients)) if clients else ((), ())

        def samples(B, w):  # f_i = 1/(2 n_i) sum_j (y_ij - <B w, x_ij>)^2
            beta = betas(B, w)
            return torch.stack([sample_gradient(Xi, yi, beta[i]) for i, (Xi, yi) in enumerate(zip(X, y))])

        return samples

    def client_loss(self, client, B, w, g) -> torch.Tensor:
        if self.settings.ft_gradients == "population":
            return 0.5 * (g * g).sum()
        return 0.5 * (residuals(*self.ctx.samples(client), (B * w).sum(1)) ** 2).mean()

    def round(self, round_index) -> Round:
        result = super().round(round_index)
        result.fields.update(self.representation(round_index))
        return result

    def representation(self, round_index) -> dict:
        """linear-rep: dist(B, B*) of the server's model and the norm of the global loss's gradient (rank 0)."""
        if self.truth is None or not self.is_server:
            return {}
        views = self.ctx.stack.layout.views(self.ctx.global_weights)
        B, w = views["B"], views["w"]
        mean_target = self.B_star @ self.w_star.mean(0)
        r = B @ w - mean_target  # the global loss (1/M) sum 1/2 ||B w - B* w*_i||^2 has grad_beta = B w - mean
        grad_norm = math.sqrt(float((torch.outer(r, w) ** 2).sum() + ((B.T @ r) ** 2).sum()))
        fields = {"rep_dist": principal_angle_distance(B, self.B_star), "grad_norm": grad_norm}
        self.history.append({"round": round_index + 1, **fields})
        return fields

    # -- after training ---------------------------------------------------------------------------------
    def finish(self, run_dir: Path | None):
        if not self.is_server:
            return None
        if self.truth is not None:
            result = self.fine_tune_linear()
            if run_dir is not None:
                plot_linear_run({self.label(): (self.history, result)}, run_dir)
            return {
                "fine_tuning": result,
                "final_rep_dist": self.history[-1]["rep_dist"],
                "final_grad_norm": self.history[-1]["grad_norm"],
            }
        result = {"fine_tuning": self.fine_tune_network(), "feature_similarity": self.feature_similarity().tolist()}
        if run_dir is None:
            return result
        plot_similarity(
            np.array(result["feature_similarity"]),
            run_dir / "feature_similarity.png",
            f"{self.label()}: cosine similarity of penultimate features by class",
        )
        if result["fine_tuning"]:
            plot_fine_tuning({self.label(): result["fine_tuning"]}, run_dir / "fine_tuning.png", "accuracy")
        return result

    def label(self) -> str:
        tau = self.settings.local_steps
        if tau == 1:
            return "D-GD" if self.truth is not None and self.settings.ft_gradients == "population" else "D-SGD"
        return f"FedAvg (tau={tau})" if tau else "FedAvg"

    def new_clients(self):
        s = self.settings
        for trial in range(s.ft_trials):
            for j in range(s.ft_new_clients):
                yield trial, j

    def fine_tune_linear(self) -> dict:
        """Per n: mean and std over the new clients of ||B w - B* w*||^2 after --ft-steps full-batch GD
        steps on (B, w) from the trained model, with n fresh samples y = <B* w*, x> + noise."""
        ctx, s = self.ctx, self.settings
        views = ctx.stack.layout.views(ctx.global_weights.double())
        d, k = views["B"].shape
        errors: dict[int, list[float]] = {n: [] for n in s.ft_new_samples}
        for trial, j in self.new_clients():
            gen = ctx.generator("fine-tune", trial, j)
            w_new = torch.randn(k, generator=gen, dtype=torch.float64)
            beta = self.B_star.double().cpu() @ w_new
            for n in s.ft_new_samples:
                X = torch.randn(n, d, generator=gen, dtype=torch.float64)
                y = X @ beta + self.truth["noise"] * torch.randn(n, generator=gen, dtype=torch.float64)
                B, w = linear_gd(
                    views["B"].cpu()[None],
                    views["w"].cpu()[None],
                    lambda B, w: sample_gradient(X, y, betas(B, w)[0])[None],
                    s.ft_lr or ctx.cfg.lr,
                    s.ft_steps,
                )
                errors[n].append(float(((B[0] @ w[0] - beta) ** 2).sum()))
        return summarise(errors)

    def fine_tune_network(self) -> dict:
        """Per n: mean and std over trials x new clients of the test accuracy on the held-out classes
        after --ft-epochs epochs of SGD on n samples of those classes, from the trained network ({}
        when no class is held out)."""
        ctx, s, held = self.ctx, self.settings, self.ctx.data.held_out
        if held is None:
            return {}
        lr = s.ft_lr or ctx.cfg.lr
        opt = SGDSettings(ctx.cfg.batch_size, s.ft_epochs, ctx.cfg.momentum, ctx.cfg.weight_decay)
        scores: dict[int, list[float]] = {n: [] for n in s.ft_new_samples}
        for trial, j in self.new_clients():
            rng = ctx.rng("fine-tune", trial, j)
            for n in s.ft_new_samples:
                chosen = torch.from_numpy(np.sort(rng.choice(len(held["y"]), min(n, len(held["y"])), replace=False)))
                flat = ctx.global_weights[None].clone()
                ctx.train(
                    1_000_000 + trial,
                    flat,
                    [ctx.cfg.peers + 1 + j],
                    opt,
                    shards=[chosen],
                    data=(held["x"], held["y"]),
                    lr=lr,
                )
                scores[n].append(float(evaluate(ctx.stack, flat, held["test_x"], held["test_y"])["acc"][0]))
        return summarise(scores)

    def feature_similarity(self, per_class: int = 100) -> torch.Tensor:
        """(C, C): the mean cosine similarity between the trained network's penultimate features (the
        last Linear layer's input) of test images of classes i and j, self-pairs left out."""
        ctx, held = self.ctx, self.ctx.data.held_out
        x, y = (held["all_test_x"], held["all_test_y"]) if held else (ctx.data.test_x, ctx.data.test_y)
        C = ctx.data.n_classes
        pick = torch.cat([torch.nonzero(y == c).flatten()[:per_class] for c in range(C)])
        with torch.no_grad():
            features = ctx.stack.forward(ctx.global_weights[None], x[pick], shared_input=True, features=True)[1][0]
        f = nn.functional.normalize(features.flatten(1).double(), dim=1)
        sim, labels = f @ f.T, y[pick]
        out = torch.zeros(C, C, dtype=torch.float64)
        for i in range(C):
            for j in range(C):
                block = sim[labels == i][:, labels == j]
                if i == j:
                    m = len(block)
                    out[i, j] = float((block.sum() - block.diagonal().sum()) / max(1, m * (m - 1)))
                else:
                    out[i, j] = float(block.mean())
        return out
