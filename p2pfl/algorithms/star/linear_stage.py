"""TCT's stage 2, the convexified problem (Yu et al. 2022, Alg. 1-3 of the appendix): every sample is its
eNTK feature vector, standardised with global statistics, and a linear model is fitted to centred one-hot
targets by least squares, each client taking M full-batch gradient steps corrected by SCAFFOLD's h_k,
in p-space or, exactly and cheaper where n < p, in n-space."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from p2pfl.comm import Payload
from p2pfl.errors import UserError

POWER_ITERATIONS = 30  # for each client's lambda_max (an estimate from below: the share leaves room)
FEATURE_WORKING_SET = 2 * 2**30  # the per-sample gradients entk_features holds for a chunk (its memory_gb)


def n_space(solver: str, n: int, p: int) -> bool:
    """Whether a client of n samples steps in n-space (--tct-solver; auto: where n < p)."""
    return solver == "n-space" or (solver == "auto" and n < p)


def feature_notes(model: str, features: int, total: int, network: int, samples: int, need: int) -> list[str]:
    """The run header's lines: how many eNTK coordinates are kept, and what stage 2 will hold."""
    if features >= total:
        kept = (
            f"tct: the convexified {model} has {total:,} parameters (head of 1 logit), not more than "
            f"--tct-features {features:,}: all of them are kept, no subsampling"
        )
    else:
        kept = f"tct: eNTK features: {features:,} of the convexified {model}'s {total:,} parameters (the network has {network:,})"
    return [
        kept,
        f"tct: stage 2 holds the features of {samples:,} samples on the busiest rank: about "
        f"{need / 2**30:.1f} GiB (n x p x 2 bytes, with the Grams where n < p and the server's test "
        f"features); --train-samples and --tct-features shrink it",
    ]


def check_feature_memory(samples: int, need: int, where: str, have: int) -> None:
    """Refuse, before stage 1 is spent, a run whose stage-2 features cannot fit the rank's memory."""
    if need > have:
        raise UserError(
            f"tct: the eNTK features of {samples:,} samples would take about {need / 2**30:,.1f} GiB "
            f"on one rank, more than {where}'s {have / 2**30:,.1f} GiB: use --train-samples (fewer "
            "samples), --tct-features (fewer coordinates) or more ranks"
        )


def linear_scores(test_features: StandardFeatures, server: torch.Tensor, clients: torch.Tensor, y: torch.Tensor):
    """Test accuracy and loss of the server's linear model (p + 1, C) and each client's (K, p + 1, C):
    ({metric: float}, {metric: (K,)})."""
    C = server.shape[1]
    models = torch.cat([server[None], clients])
    out = test_features.matmul(torch.cat(list(models), 1)).view(len(y), len(models), C)
    target = centred_one_hot(y, C)
    acc = (out.argmax(2) == y[:, None]).double().mean(0)
    loss = 0.5 * ((out - target[:, None]) ** 2).sum(2).double().mean(0)
    return {"acc": float(acc[0]), "loss": float(loss[0])}, {"acc": acc[1:], "loss": loss[1:]}


def feature_memory(sizes: list[int], p: int, solver: str, tests: int) -> tuple[int, int]:
    """(samples, bytes) of what stage 2 keeps on a rank: each client's float16 features (n_k x p), its
    float32 Gram where it steps in n-space, the test features (tests samples) and the working set."""
    need = sum(2 * n * p + (4 * n * n if n_space(solver, n, p) else 0) for n in sizes) + 2 * tests * p
    return sum(sizes) + tests, need + FEATURE_WORKING_SET


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
            z = raw[s : s + rows].double()
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


def local_steps_n_space(
    Z: StandardFeatures, gram: torch.Tensor, Y, theta, h, lr: float, steps: int, u: torch.Tensor | None = None
) -> torch.Tensor:
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


def client_round(
    Z: StandardFeatures,
    gram: torch.Tensor | None,
    Y,
    theta,
    h,
    previous,
    lr: float,
    steps: int,
    scaffold: bool = True,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One client's stage-2 round (the paper's Alg. 1): eq. (2) h_k += (theta - previous) / (M lr), where
    previous is its last local model (none in its first round: h stays 0), then eq. (3), M full-batch
    steps corrected by h_k; in n-space when its Gram matrix is given (reusing residual = Z~ theta - Y
    if the caller has it). Returns (new local model, h_k)."""
    if scaffold and previous is not None:
        h = h + (theta - previous) / (steps * lr)
    if gram is not None:
        return local_steps_n_space(Z, gram, Y, theta, h, lr, steps, residual), h
    return local_steps_p_space(Z, Y, theta, h, lr, steps), h
