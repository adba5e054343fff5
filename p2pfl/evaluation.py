"""Scoring every peer's model on the test set: on a stratified subset for the clients where one is asked
for (with the standard error it brings), on personal test sets for DisPFL's personal accuracy, and only
the peers whose weights changed since they were last scored."""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from p2pfl.seeding import numpy_rng
from p2pfl.forward import evaluate, evaluation_chunks
from p2pfl.training import padded_shards


def largest_remainder(share: np.ndarray, total: int) -> np.ndarray:
    """Whole counts that sum to total, each the floor of its share plus one for the largest remainders."""
    quota = np.floor(share).astype(int)
    quota[np.argsort(-(share - quota), kind="stable")[: total - quota.sum()]] += 1
    return quota


def client_test_subset(labels: torch.Tensor, size: int, seed: int, stratify: bool) -> torch.Tensor | None:
    """The test samples every client model is scored on (--client-test-samples): size of them, drawn once
    from the seed, each class in its share of the set; None: all of them (size 0, or not below the set's)."""
    if size == 0 or size >= len(labels):
        return None
    y = labels.cpu().numpy() if stratify else np.zeros(len(labels), dtype=np.int64)
    strata = [np.flatnonzero(y == c) for c in np.unique(y)]
    quota = largest_remainder(size * np.array([len(s) for s in strata]) / len(y), size)
    rng = numpy_rng(seed, "client-test")
    return torch.from_numpy(np.sort(np.concatenate([rng.choice(s, q, replace=False) for s, q in zip(strata, quota)])))


def subset_mean_error(values: np.ndarray, strata: np.ndarray, population: dict) -> float:
    """Standard error of a mean over a stratified subset of the test set against the same mean over the
    whole set: sqrt(sum_h W_h^2 (1 - n_h/N_h) s_h^2 / n_h), where values are per-sample scores (the
    clients' mean accuracy on each sample), s_h their spread within class h of the subset, N_h the set's
    count of class h and W_h = N_h / N."""
    total = sum(population.values())
    variance = 0.0
    for h, big_n in population.items():
        v = values[strata == h]
        if len(v) > 1 and len(v) < big_n:
            variance += (big_n / total) ** 2 * (1 - len(v) / big_n) * v.var(ddof=1) / len(v)
    return math.sqrt(variance)


def personal_test_sets(ctx) -> list[torch.Tensor]:
    """Each of this rank's peers' personal test set (DisPFL's): ceil(test size / peers) test samples
    drawn, seeded per peer, with the label proportions of the peer's training shard (largest
    remainder rounding; a class short of test samples is drawn with replacement)."""
    labels = ctx.data.test_y.cpu().numpy()
    by_class = {c: np.flatnonzero(labels == c) for c in range(ctx.data.n_classes)}
    size = math.ceil(len(labels) / ctx.cfg.peers)
    out = []
    for p in ctx.peers:
        counts = np.bincount(ctx.samples(p)[1].cpu().numpy(), minlength=ctx.data.n_classes)[
            : ctx.data.n_classes
        ].astype(float)
        quota = largest_remainder(size * counts / max(1.0, counts.sum()), size)
        rng = numpy_rng(ctx.cfg.seed, "personal-test", p)
        picks = [
            rng.choice(by_class[c], q, replace=q > len(by_class[c]))
            for c, q in enumerate(quota)
            if q and len(by_class[c])
        ]
        out.append(torch.from_numpy(np.sort(np.concatenate(picks))) if picks else torch.zeros(0, dtype=torch.long))
    return out


@functools.lru_cache(maxsize=4)
def _fingerprint_multipliers(width: int, device: torch.device) -> torch.Tensor:
    """Fixed random odd int64 multipliers, one per 32-bit word of a row: drawn once per width and device."""
    gen = torch.Generator().manual_seed(0x5EED)
    return (torch.randint(-(2**62), 2**62, (width,), generator=gen) * 2 + 1).to(device)


def row_fingerprints(flat: torch.Tensor) -> torch.Tensor:
    """(L,) int64: each row's bits weighted by fixed random odd multipliers and summed in exact (wrapping)
    integer arithmetic, so that a row whose weights changed in any bit gets another fingerprint (two
    different rows agree with chance about 2^-64); in row blocks of about 256 MB."""
    bits = flat.contiguous().view(torch.int32)
    multipliers = _fingerprint_multipliers(bits.shape[1], flat.device)
    block = max(1, 2**25 // max(1, bits.shape[1]))
    return torch.cat([(bits[i : i + block].long() * multipliers).sum(1) for i in range(0, len(bits), block)])


class PeerScores:
    """Each peer's test metrics, gathered to rank 0 in peer order with every peer's weights."""

    def __init__(self, ctx):
        self.ctx = ctx
        test_n = ctx.cfg.test_samples or len(ctx.data.test_y)
        self.test_x, self.test_y = ctx.data.test_x[:test_n], ctx.data.test_y[:test_n]
        classification = ctx.stack.task.name == "classification"
        subset = client_test_subset(self.test_y, ctx.cfg.client_test_samples, ctx.cfg.seed, classification)
        self.client_x, self.client_y = (
            (self.test_x, self.test_y)
            if subset is None
            else (self.test_x[subset.to(self.test_x.device)], self.test_y[subset.to(self.test_y.device)])
        )
        strata = self.test_y.cpu().numpy() if classification else np.zeros(len(self.test_y), dtype=np.int64)
        self.population = {int(h): int(n) for h, n in zip(*np.unique(strata, return_counts=True))}
        self.client_strata = strata[subset.numpy()] if subset is not None else None  # None: no subset, no error
        # each local peer's personal test set as a row of test indices padded to the longest, and its mask:
        # on the device once, so that personal accuracy is one batched pass like the other metrics
        self.personal = personal_rows(personal_test_sets(ctx), ctx.device) if classification else None
        # each local peer's scores as last evaluated, and the fingerprints of the weights they were for:
        # a peer whose weights did not change since (a star's clients not sampled) is not evaluated again
        self.scored: torch.Tensor | None = None
        self.scores: dict[str, torch.Tensor] = {}
        self.sample_scores: torch.Tensor | None = None  # (local peers, client test samples): the headline metric

    def evaluate_all(self) -> tuple[torch.Tensor | None, dict[str, torch.Tensor] | None, float | None]:
        """Gathered weights (P, D), each peer's test metrics {metric: (P,)} on the client test samples,
        and the standard error of the peers' mean headline metric from scoring a subset, on rank 0."""
        ctx = self.ctx
        scores, sample_sum = self.local_scores()
        weights = ctx.transport.gather_rows(ctx.flat.float())
        gathered = {m: ctx.transport.gather_rows(v[:, None].double()) for m, v in scores.items()}
        sample_sums = ctx.transport.gather(sample_sum.cpu()) if self.client_strata is not None else None
        if weights is None:
            return None, None, None
        error = None
        if sample_sums is not None:
            per_sample = (sum(sample_sums) / len(weights)).numpy()
            error = subset_mean_error(per_sample, self.client_strata, self.population)
        return weights, {m: v[:, 0] for m, v in gathered.items()}, error

    def local_scores(self) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """This rank's peers' metrics {metric: (peers,)} on the client test samples (and personal_acc),
        and their headline metric summed over the peers, sample by sample (n,). Only the peers whose
        weights changed since they were last scored are evaluated."""
        ctx, head = self.ctx, self.ctx.stack.task.headline
        prints = row_fingerprints(ctx.flat)
        stale = torch.ones_like(prints, dtype=torch.bool) if self.scored is None else prints != self.scored
        rows = stale.nonzero()[:, 0]
        if len(rows):
            fresh, by_sample = self.evaluate_rows(rows)
            if self.personal is not None:
                fresh["personal_acc"] = self.personal_accuracy(rows.tolist())
            if self.scored is None:
                self.scores = {m: torch.zeros(len(prints), dtype=v.dtype, device=v.device) for m, v in fresh.items()}
                self.sample_scores = torch.zeros(len(prints), len(self.client_y), device=by_sample[head].device)
            for m, v in fresh.items():
                self.scores[m][rows] = v
            self.sample_scores[rows] = by_sample[head]
        self.scored = prints
        return {m: v.clone() for m, v in self.scores.items()}, self.sample_scores.double().sum(0)

    def evaluate_rows(self, rows: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """evaluate on the client test samples for these local rows, a chunk of peers at a time (the chunks
        evaluate itself would take), so that only a chunk's weights are copied out, not every stale row's."""
        ctx = self.ctx
        if len(rows) == len(ctx.flat):  # every row: evaluate takes views of ctx.flat
            return evaluate(ctx.stack, ctx.flat, self.client_x, self.client_y, by_sample=True)
        chunk, _ = evaluation_chunks(ctx.stack, len(rows), len(self.client_y), tuple(self.client_x.shape[1:]))
        parts = [
            evaluate(ctx.stack, ctx.flat[part], self.client_x, self.client_y, by_sample=True)
            for part in rows.split(chunk)
        ]
        return tuple({m: torch.cat([part[k][m] for part in parts]) for m in parts[0][k]} for k in (0, 1))

    def personal_accuracy(self, rows: list[int]) -> torch.Tensor:
        """(rows,): these local peers' own models, each on its personal test set, as batched passes of as
        many peers as evaluation takes at once (each on its own samples; padding counts for none)."""
        ctx, (index, mask) = self.ctx, self.personal
        acc = torch.zeros(len(rows), device=ctx.device)
        if index.shape[1] == 0:
            return acc
        chunk, _ = evaluation_chunks(ctx.stack, len(rows), index.shape[1], tuple(ctx.data.test_x.shape[1:]))
        picked = torch.tensor(rows, device=ctx.device)
        for start in range(0, len(rows), chunk):
            part = picked[start : start + chunk]
            at, counts = index[part], mask[part]
            outputs = ctx.stack.forward(ctx.flat[part], ctx.data.test_x[at], shared_input=False)
            right = ctx.stack.task.per_sample(outputs, ctx.data.test_y[at])["acc"] * counts
            acc[start : start + len(part)] = right.sum(1) / counts.sum(1).clamp(min=1)
        return acc


def personal_rows(indices: list[torch.Tensor], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(index (L, W), mask (L, W)) on device: each peer's test indices as a row padded with 0, as training's
    shards are (padded_shards), and 1.0 where a row holds a sample."""
    width = max(map(len, indices), default=0)
    lengths = torch.tensor([len(row) for row in indices], device=device)
    mask = (torch.arange(width, device=device)[None] < lengths[:, None]).float()
    return padded_shards(indices, width, device), mask
