"""Scoring the peers' models on the test set: each peer on its own stratified subset of it, drawn from
(seed, peer), with the sampling variance of its score (so the peers' mean carries a standard error
that falls with the number of peers); DisPFL's personal test sets; and only the peers whose weights
changed since they were last scored. Nothing here gathers: a rank scores its own peers."""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

from p2pfl.local.forward import evaluate, evaluate_own, evaluation_chunks
from p2pfl.models import PeerStack
from p2pfl.seeding import numpy_rng

SE_TARGET = 0.002  # the standard error the default client subsets hold the peers' mean accuracy to (0.2 points)


def client_subset_size(requested: int | None, peers: int, test_size: int) -> int:
    """The test samples each client model is scored on: --client-test-samples, or by default enough that
    the peers' mean accuracy has a standard error of at most SE_TARGET whatever the accuracies. Each
    score's variance is at most (1 - n/N) / (4n) (n of the N samples drawn without replacement) and the
    peers' draws are independent, so (1 - n/N) / (4 n peers) <= SE_TARGET^2 gives n = aN / (N + a) with
    a = 1 / (4 peers SE_TARGET^2): 205 of 10,000 at 300 peers. 0: the whole set."""
    if requested is None:
        a = 0.25 / SE_TARGET**2 / peers
        requested = math.ceil(a * test_size / (test_size + a))
    return test_size if requested == 0 else min(requested, test_size)


def largest_remainder(share: np.ndarray, total: int) -> np.ndarray:
    """Whole counts that sum to total, each the floor of its share plus one for the largest remainders."""
    quota = np.floor(share).astype(int)
    quota[np.argsort(-(share - quota), kind="stable")[: total - quota.sum()]] += 1
    return quota


def class_strata(labels: torch.Tensor, stratify: bool) -> np.ndarray:
    """Each test sample's stratum: its class, or one stratum for all (a regression task's)."""
    return labels.cpu().numpy() if stratify else np.zeros(len(labels), dtype=np.int64)


def client_test_subset(strata: np.ndarray, size: int, seed: int, peer: int) -> np.ndarray:
    """The test samples peer's model is scored on: size of them, drawn from (seed, peer), each stratum in
    its share of the set (largest remainder rounding), sorted."""
    groups = [np.flatnonzero(strata == h) for h in np.unique(strata)]
    quota = largest_remainder(size * np.array([len(g) for g in groups]) / len(strata), size)
    rng = numpy_rng(seed, "client-test", peer)
    return np.sort(np.concatenate([rng.choice(g, q, replace=False) for g, q in zip(groups, quota)]))


def subset_variance(values: np.ndarray, strata: np.ndarray, population: dict[int, int]) -> np.ndarray:
    """(L,): the sampling variance of each row's mean over its stratified subset, against the same mean
    over the whole set: sum_h W_h^2 (1 - n_h/N_h) s_h^2 / n_h, where values (L, n) are per-sample scores,
    strata (L, n) their strata, s_h a row's spread within stratum h, N_h the set's count of h and
    W_h = N_h / N."""
    total = sum(population.values())
    variance = np.zeros(len(values))
    for h, big_n in population.items():
        inside = strata == h
        count = inside[0].sum() if len(values) else 0  # every row draws the same count from each stratum
        if 1 < count < big_n:
            v = values[inside].reshape(len(values), count)
            variance += (big_n / total) ** 2 * (1 - count / big_n) * v.var(axis=1, ddof=1) / count
    return variance


def personal_test_sets(
    test_labels: torch.Tensor, classes: int, train_labels: list[torch.Tensor], peers: list[int], total: int, seed: int
) -> list[torch.Tensor]:
    """Each of the peers' personal test set (DisPFL's): ceil(test size / total peers) test samples drawn,
    seeded per peer, with the label proportions of the peer's training labels (largest remainder
    rounding; a class short of test samples is drawn with replacement)."""
    labels = test_labels.cpu().numpy()
    by_class = {c: np.flatnonzero(labels == c) for c in range(classes)}
    size = math.ceil(len(labels) / total)
    out = []
    for p, own in zip(peers, train_labels):
        counts = np.bincount(own.cpu().numpy(), minlength=classes)[:classes].astype(float)
        quota = largest_remainder(size * counts / max(1.0, counts.sum()), size)
        rng = numpy_rng(seed, "personal-test", p)
        picks = [
            rng.choice(by_class[c], q, replace=q > len(by_class[c]))
            for c, q in enumerate(quota)
            if q and len(by_class[c])
        ]
        out.append(torch.from_numpy(np.sort(np.concatenate(picks))) if picks else torch.zeros(0, dtype=torch.long))
    return out


@functools.lru_cache(maxsize=4)
def _fingerprint_multipliers(width: int, device: torch.device) -> torch.Tensor:
    """Fixed random odd int32 multipliers, one per 32-bit word of a row: drawn once per width and device."""
    gen = torch.Generator().manual_seed(0x5EED)
    return (torch.randint(-(2**30), 2**30, (width,), generator=gen, dtype=torch.int32) * 2 + 1).to(device)


def row_fingerprints(flat: torch.Tensor) -> torch.Tensor:
    """(L,) int64: each row's bits times fixed random odd multipliers (wrapping int32 products: a change in
    any bit of a word changes its product) summed in int64, so that a row whose weights changed gets
    another fingerprint (two different rows agree with chance about 2^-32); in row blocks of about 4 MB,
    which a CPU's cache holds (7x faster than one block of 100 MLPs)."""
    bits = flat.contiguous().view(torch.int32)
    multipliers = _fingerprint_multipliers(bits.shape[1], flat.device)
    block = max(1, 2**20 // max(1, bits.shape[1]))
    return torch.cat([(bits[i : i + block] * multipliers).sum(1) for i in range(0, len(bits), block)])


class PeerScores:
    """This rank's peers' client metrics: each peer's model on its own client test subset (or on every
    test sample), with the sampling variance of its headline score, and on its personal test set where
    one is given (in the same pass as its subset). A peer whose weights did not change since it was
    scored (a star's clients not sampled) keeps its scores."""

    def __init__(
        self,
        stack: PeerStack,
        data: tuple[torch.Tensor, torch.Tensor],
        test_count: int,
        peers: tuple[list[int], int],
        requested: int | None,
        seed: int,
        personal: tuple[list[torch.Tensor], int] | None = None,
    ):
        """data: the whole test set (x, y), of which the first test_count samples are scored (--test-samples);
        peers: (this rank's peers, the run's number of peers); requested: --client-test-samples; personal:
        (each of this rank's peers' training labels, the classes), from which its personal test set is drawn."""
        (mine, total), (self.x, self.y) = peers, data
        self.stack, self.test_x, self.test_y = stack, self.x[:test_count], self.y[:test_count]
        strata = class_strata(self.test_y, stack.task.name == "classification")
        self.population = {int(h): int(n) for h, n in zip(*np.unique(strata, return_counts=True))}
        size = client_subset_size(requested, total, test_count)
        self.sampled = size < test_count  # False: every client on every test sample, exactly
        picks = np.stack([client_test_subset(strata, size, seed, p) for p in mine]) if self.sampled else None
        self.index = torch.from_numpy(picks).to(self.x.device) if picks is not None else None
        self.strata = strata[picks] if picks is not None else None
        # each peer's personal test set as a row of indices padded to the longest, and its mask
        self.personal = None
        if personal is not None:
            sets = personal_test_sets(self.y, personal[1], personal[0], mine, total, seed)
            self.personal = personal_rows(sets, self.x.device)
        self.scored: torch.Tensor | None = None  # the fingerprints of the weights last scored
        self.scores: dict[str, torch.Tensor] = {}
        self.variances = torch.zeros(len(mine), dtype=torch.float64)

    def local_scores(self, flat: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
        """({metric: (L,) float64}, the sampling variance (L,) of each headline score, None where every
        client sees every test sample). Only the rows whose weights changed are evaluated."""
        prints = row_fingerprints(flat)
        stale = torch.ones_like(prints, dtype=torch.bool) if self.scored is None else prints != self.scored
        if bool(stale.any()):
            # every row (a graph's round, a star's first): a slice, so that weights and indices are views
            rows = slice(None) if bool(stale.all()) else stale.nonzero()[:, 0]
            fresh = self.evaluate_rows(flat, rows) if self.sampled else self.evaluate_whole(flat, rows)
            for m, v in fresh.items():
                self.scores.setdefault(m, torch.zeros(len(flat), dtype=torch.float64))[on_cpu(rows)] = v.double().cpu()
        self.scored = prints
        return {m: v.clone() for m, v in self.scores.items()}, self.variances.clone() if self.sampled else None

    def evaluate_rows(self, flat: torch.Tensor, rows) -> dict[str, torch.Tensor]:
        """These rows' (an index, or a slice of all) metrics on their own client test samples and personal
        test sets, one pass for both; their headline scores' sampling variances kept."""
        own = self.index[rows]
        index = own if self.personal is None else torch.cat([own, self.personal[0][rows]], 1)
        by_sample = evaluate_own(self.stack, flat[rows], self.x, self.y, index)
        head = by_sample[self.stack.task.headline][:, : own.shape[1]].double().cpu().numpy()
        strata = self.strata[on_cpu(rows)]
        self.variances[on_cpu(rows)] = torch.from_numpy(subset_variance(head, strata, self.population))
        fresh = {m: v[:, : own.shape[1]].mean(1) for m, v in by_sample.items()}
        if self.personal is not None:
            fresh["personal_acc"] = personal_mean(by_sample["acc"][:, own.shape[1] :], self.personal[1][rows])
        return fresh

    def evaluate_whole(self, flat: torch.Tensor, rows) -> dict[str, torch.Tensor]:
        """These rows' (an index, or a slice of all) metrics on every test sample (a chunk of rows at a
        time: only a chunk's weights copied out) and on their personal test sets."""
        if isinstance(rows, slice):  # every row: evaluate takes views of flat
            fresh = evaluate(self.stack, flat, self.test_x, self.test_y)
        else:
            chunk, _ = evaluation_chunks(self.stack, len(rows), len(self.test_y), tuple(self.test_x.shape[1:]))
            parts = [evaluate(self.stack, flat[part], self.test_x, self.test_y) for part in rows.split(chunk)]
            fresh = {m: torch.cat([part[m] for part in parts]) for m in parts[0]}
        if self.personal is not None:
            index, mask = self.personal
            right = evaluate_own(self.stack, flat[rows], self.x, self.y, index[rows])["acc"] if index.shape[1] else None
            fresh["personal_acc"] = personal_mean(right, mask[rows])
        return fresh


def on_cpu(rows):
    """A row selection (an index tensor, or a slice of all) for CPU-side arrays and tensors."""
    return rows if isinstance(rows, slice) else rows.cpu().numpy()


def personal_mean(right: torch.Tensor | None, mask: torch.Tensor) -> torch.Tensor:
    """Each row's accuracy over its personal test set: right (L, W) per sample, mask 1.0 where a padded
    row holds a sample (None or empty: no samples, 0)."""
    if right is None or right.shape[1] == 0:
        return torch.zeros(len(mask), device=mask.device)
    return (right * mask).sum(1) / mask.sum(1).clamp(min=1)


def personal_rows(indices: list[torch.Tensor], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(index (L, W), mask (L, W)) on device: each peer's test indices as a row padded with 0, and 1.0
    where a row holds a sample."""
    width = max(map(len, indices), default=0)
    lengths = torch.tensor([len(row) for row in indices], device=device)
    mask = (torch.arange(width, device=device)[None] < lengths[:, None]).float()
    return pad_sequence(indices, batch_first=True).to(device), mask
