"""Per-round evaluation and the metrics.jsonl writer.

Weights and per-peer results are gathered to rank 0 in peer order, so the aggregated model and every
figure is computed from the same numbers whatever the layout of peers over ranks.
"""
from __future__ import annotations

import functools
import json
import math
import os
import resource
import socket
import time
from pathlib import Path

import numpy as np
import torch

from p2pfl.diagnostics import round_diagnostics
from p2pfl.errors import DivergenceError
from p2pfl.seeding import numpy_rng
from p2pfl.training import evaluate


def peak_gpu_mib(device: torch.device) -> float | None:
    """This process's high-water mark of GPU memory on device, MiB (torch's allocator); None off a GPU."""
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 2**20


def gpu_identity(device: torch.device) -> str | None:
    """Which physical GPU device is (ranks that share one report the same), None off a GPU."""
    if device.type != "cuda":
        return None
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    return str(uuid) if uuid is not None else f"{socket.gethostname()}:{device}"


def busiest_gpu_mib(marks: list[tuple[float | None, str | None]]) -> float | None:
    """From each rank's (peak GPU MiB, GPU identity): the largest sum over the ranks that share one GPU,
    which is what must fit on it (4 ranks sharing a GPU each peaking at 10 GiB need 40); None: no GPU."""
    per_gpu: dict[str, float] = {}
    for peak, gpu in marks:
        if peak is not None:
            per_gpu[gpu] = per_gpu.get(gpu, 0.0) + peak
    return max(per_gpu.values()) if per_gpu else None


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work: a clock read before it on a GPU measures the launches only."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_rss_kib() -> int:
    """This process's peak resident memory, KiB. Linux's ru_maxrss keeps the peak of the process that
    started this one (exec carries it over: a run started from pytest or a bench reported their
    memory), so the high-water mark of this process's own memory, VmHWM, is read where there is one."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def inter_model_variance(weights: torch.Tensor) -> float:
    """NTK-DFL eq. (6): V = (1/d) sum_j sqrt(sum_i (wbar_j - w_ij)^2), over parameters j and peers i."""
    value = float((torch.var(weights.double(), dim=0, correction=0) * len(weights)).sqrt().mean())
    return float(f"{value:.10g}")  # the last bits of a long float64 sum depend on the thread count


def aggregate(weights: torch.Tensor, counts: list[int], kind: str) -> torch.Tensor:
    """The aggregated model: uniform or sample-weighted average of all peers' weights."""
    if kind == "uniform":
        return weights.mean(0)
    w = torch.tensor(counts, dtype=weights.dtype, device=weights.device)
    return (w[:, None] * weights).sum(0) / w.sum()


def run_model(ctx, weights: torch.Tensor, algorithm) -> torch.Tensor:
    """The model a run reports: a star's server model, else the algorithm's own aggregate of all peers'
    weights where it has one, else their --aggregate average."""
    if ctx.global_weights is not None:
        return ctx.global_weights
    own = algorithm.aggregate_model(weights.to(ctx.device))
    if own is not None:
        return own
    return aggregate(weights.to(ctx.device), ctx.sample_counts, ctx.cfg.aggregate)


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
        counts = np.bincount(ctx.samples(p)[1].cpu().numpy(),
                             minlength=ctx.data.n_classes)[: ctx.data.n_classes].astype(float)
        quota = largest_remainder(size * counts / max(1.0, counts.sum()), size)
        rng = numpy_rng(ctx.cfg.seed, "personal-test", p)
        picks = [rng.choice(by_class[c], q, replace=q > len(by_class[c]))
                 for c, q in enumerate(quota) if q and len(by_class[c])]
        out.append(torch.from_numpy(np.sort(np.concatenate(picks))) if picks else torch.zeros(0, dtype=torch.long))
    return out


@functools.lru_cache(maxsize=4)
def _fingerprint_multipliers(width: int, device: torch.device) -> torch.Tensor:
    """Fixed random odd int64 multipliers, one per 32-bit word of a row: drawn once per width and device."""
    gen = torch.Generator().manual_seed(0x5EED)
    return (torch.randint(-2**62, 2**62, (width,), generator=gen) * 2 + 1).to(device)


def row_fingerprints(flat: torch.Tensor) -> torch.Tensor:
    """(L,) int64: each row's bits weighted by fixed random odd multipliers and summed in exact (wrapping)
    integer arithmetic, so that a row whose weights changed in any bit gets another fingerprint (two
    different rows agree with chance about 2^-64); in row blocks of about 256 MB."""
    bits = flat.contiguous().view(torch.int32)
    multipliers = _fingerprint_multipliers(bits.shape[1], flat.device)
    block = max(1, 2**25 // max(1, bits.shape[1]))
    return torch.cat([(bits[i:i + block].long() * multipliers).sum(1) for i in range(0, len(bits), block)])


def check_finite(ctx, round_index: int) -> None:
    """Stop every rank together, naming the peers, when a model holds NaN or inf."""
    rows = (~torch.isfinite(ctx.flat).all(1)).nonzero()[:, 0].tolist()  # one read of the device, not one a peer
    bad = [ctx.peers[i] for i in rows]
    gathered = ctx.transport.gather(bad)
    every = ctx.transport.bcast(sorted(p for part in gathered for p in part) if gathered is not None else None)
    if every:
        raise DivergenceError(f"round {round_index + 1}: peers {every[:20]}{' ...' if len(every) > 20 else ''} "
                              f"have NaN/inf weights; lower --lr")


def fault_fields(faults, round_index: int, peers: int, lost: int) -> dict:
    """Who took part in a round under simulated faults, and its simulated time."""
    everyone = range(peers)
    return {"offline": [p for p in everyone if faults.offline(round_index, p)],
            "stragglers": [p for p in faults.taking_part(round_index, everyone)
                           if faults.finish_time(round_index, p) > 1.0],
            "messages_lost": lost, "sim_time": faults.simulated_time(round_index, everyone)}


class MetricsLog:
    def __init__(self, ctx, run_dir: Path | None, algorithm):
        self.ctx = ctx
        self.algorithm = algorithm  # its row_fields, test_scores and aggregate_model hooks
        self.path = run_dir / "metrics.jsonl" if run_dir is not None else None
        test_n = ctx.cfg.test_samples or len(ctx.data.test_y)
        self.test_x, self.test_y = ctx.data.test_x[:test_n], ctx.data.test_y[:test_n]
        classification = ctx.stack.task.name == "classification"
        subset = client_test_subset(self.test_y, ctx.cfg.client_test_samples, ctx.cfg.seed, classification)
        self.client_x, self.client_y = (self.test_x, self.test_y) if subset is None else \
            (self.test_x[subset.to(self.test_x.device)], self.test_y[subset.to(self.test_y.device)])
        strata = self.test_y.cpu().numpy() if classification else np.zeros(len(self.test_y), dtype=np.int64)
        self.population = {int(h): int(n) for h, n in zip(*np.unique(strata, return_counts=True))}
        self.client_strata = strata[subset.numpy()] if subset is not None else None  # None: no subset, no error
        self.rows: list[dict] = []
        self.last_weights: torch.Tensor | None = None  # every peer's weights at the last evaluation (rank 0)
        self.personal = [index.to(ctx.device) for index in personal_test_sets(ctx)] \
            if classification else None  # on the device once
        # each local peer's scores as last evaluated, and the fingerprints of the weights they were for:
        # a peer whose weights did not change since (a star's clients not sampled) is not evaluated again
        self.scored: torch.Tensor | None = None
        self.scores: dict[str, torch.Tensor] = {}
        self.sample_scores: torch.Tensor | None = None  # (local peers, client test samples): the headline metric

    def restore(self, rows: list[dict]) -> None:
        """The rows so far (a resumed run's; none for a new one, rank 0): metrics.jsonl rewritten to hold
        exactly them. Called once the run is ready to go on, so a run that fails before keeps its file."""
        self.rows = list(rows)
        if self.path is not None:
            self.path.write_text("".join(json.dumps(row) + "\n" for row in rows))

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
            flat = ctx.flat if len(rows) == len(prints) else ctx.flat[rows]
            fresh, by_sample = evaluate(ctx.stack, flat, self.client_x, self.client_y, by_sample=True)
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

    def personal_accuracy(self, rows: list[int]) -> torch.Tensor:
        """(rows,): these local peers' own models, each on its personal test set."""
        ctx, acc = self.ctx, torch.zeros(len(rows), device=self.ctx.device)
        for j, i in enumerate(rows):
            index = self.personal[i]
            if len(index):
                acc[j] = evaluate(ctx.stack, ctx.flat[i:i + 1], ctx.data.test_x[index], ctx.data.test_y[index])["acc"][0]
        return acc

    def record(self, round_index: int, train_losses: torch.Tensor | None, train_s: float, round_start: float,
               evaluate_now: bool) -> dict | None:
        """The round's row (rank 0; None elsewhere), appended to metrics.jsonl. Its times: train_s, the
        algorithm's round; eval_s, this evaluation and gathering; round_s, all since round_start (the
        previous row), so that the rows' round_s add up to the whole loop."""
        ctx = self.ctx
        eval_start = time.perf_counter()
        check_finite(ctx, round_index)
        decentralized = not self.algorithm.centralized
        sent, dense, lost = ctx.transport.counter.take()
        links = ctx.transport.counter.take_links()  # bytes per edge: a graph's diagnostic, not a star's
        rss, gpu = peak_rss_kib(), peak_gpu_mib(ctx.device)
        gathered = ctx.transport.gather((sent, dense, rss, lost, links if decentralized else {}, gpu,
                                         gpu_identity(ctx.device)))
        train = ctx.transport.gather_rows(train_losses[:, None].double()) if train_losses is not None else None
        custom = self.algorithm.test_scores(self.test_x, self.test_y) if evaluate_now else None
        weights, clients, client_error = self.evaluate_all() if evaluate_now and custom is None else (None, None, None)
        if decentralized and not evaluate_now:  # consensus distance needs every round's weights
            weights = ctx.transport.gather_rows(ctx.flat.float())
        extra = self.algorithm.gathered_fields(round_index)
        if ctx.transport.rank != 0:
            return None
        phases: dict[str, int] = {}
        dense_total = 0
        for s, d, *_ in gathered:
            for k, v in s.items():
                phases[k] = phases.get(k, 0) + v
            dense_total += sum(d.values())
        row: dict = {"round": round_index + 1, **self.algorithm.row_fields(round_index)}
        if ctx.faults is not None:
            row.update(fault_fields(ctx.faults, round_index, ctx.cfg.peers, sum(g[3] for g in gathered)))
        aggregated: dict = {}
        if custom is not None:
            aggregated, clients = custom
        elif clients is not None:
            self.last_weights = weights
            aggregated = {m: float(v[0]) for m, v in
                          evaluate(ctx.stack, run_model(ctx, weights, self.algorithm)[None], self.test_x, self.test_y).items()}
        row.update({f"test_{m}": float(v) for m, v in aggregated.items()})
        for m, v in (clients or {}).items():
            row.update({f"client_{m}_mean": float(v.mean()), f"client_{m}_min": float(v.min()),
                        f"client_{m}_max": float(v.max())})
        if client_error is not None:
            row[f"client_{ctx.stack.task.headline}_se"] = round(client_error, 6)
        if clients is not None and weights is not None:
            row["variance"] = inter_model_variance(weights)
        if decentralized and weights is not None:
            row.update(round_diagnostics(weights, ctx.schedule.graph(round_index), ctx.cfg.mixing,
                                         ctx.sample_counts, [g[4] for g in gathered]))
        row.update(extra or {})
        if train is not None and not bool(train.isnan().all()):
            row["train_loss"] = float(train.nanmean())  # the peers that trained this round
        now = time.perf_counter()
        row.update(bytes_sent=int(sum(phases.values())), bytes_dense=int(dense_total),
                   bytes_by_phase=phases, train_s=round(train_s, 4), eval_s=round(now - eval_start, 4),
                   round_s=round(now - round_start, 4),
                   peak_rss_mb=round(sum(g[2] for g in gathered) / 1024))
        gpu_peak = busiest_gpu_mib([(g[5], g[6]) for g in gathered])
        if gpu_peak is not None:
            row["peak_gpu_mb"] = round(gpu_peak)
        self.rows.append(row)
        if self.path is not None:
            append_line(self.path, json.dumps(row))
        return row


def append_line(path: Path, line: str) -> None:
    """One line appended whole or not at all: a write cut short (a full disk) is taken back, so the file
    stays readable line by line."""
    size = path.stat().st_size if path.exists() else 0
    try:
        with path.open("a") as fh:
            fh.write(line + "\n")
    except OSError:
        try:
            os.truncate(path, size)
        except OSError:
            pass
        raise


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def rounds_to_target(rows: list[dict], target: float, key: str = "test_acc") -> int | None:
    """First round whose accuracy reaches target, or None."""
    for row in rows:
        value = row.get(key)
        if value is not None and not math.isnan(value) and value >= target:
            return row["round"]
    return None
