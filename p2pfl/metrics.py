"""Per-round evaluation and the metrics.jsonl writer.

Weights and per-peer results are gathered to rank 0 in peer order, so the aggregated model and every
figure is computed from the same numbers whatever the layout of peers over ranks.
"""

from __future__ import annotations

import json
import math
import os
import resource
import socket
import time
from pathlib import Path

import torch

from p2pfl.diagnostics import round_diagnostics
from p2pfl.errors import DivergenceError
from p2pfl.evaluation import PeerScores
from p2pfl.forward import evaluate


def peak_gpu_mib(device: torch.device) -> float | None:
    """This process's high-water mark of GPU memory on device, MiB, as torch's allocator held it from the
    driver (reserved: tensors, its cache and their fragmentation; what the device had to give, which the
    allocated peak understates); None off a GPU. The CUDA context (a few hundred MiB a process) is not in it."""
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_reserved(device) / 2**20


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


VARIANCE_BLOCK = 2**22  # float64 entries (32 MiB) of the weights taken at once for the variance


def inter_model_variance(weights: torch.Tensor) -> float:
    """NTK-DFL eq. (6): V = (1/d) sum_j sqrt(sum_i (wbar_j - w_ij)^2), over parameters j and peers i; in
    blocks of parameters, so that its float64 copies stay within VARIANCE_BLOCK, not several P x D."""
    cols = max(1, VARIANCE_BLOCK // max(1, len(weights)))
    spread = torch.cat(
        [
            (torch.var(weights[:, c : c + cols].double(), dim=0, correction=0) * len(weights)).sqrt()
            for c in range(0, weights.shape[1], cols)
        ]
    )
    value = float(spread.mean())
    return float(f"{value:.10g}")  # the last bits of a long float64 sum depend on the thread count


def aggregate(weights: torch.Tensor, counts: list[int], kind: str) -> torch.Tensor:
    """The aggregated model: uniform or sample-weighted average of all peers' weights."""
    if kind == "uniform":
        return weights.mean(0)
    w = torch.tensor(counts, dtype=weights.dtype, device=weights.device)
    return (w[:, None] * weights).sum(0) / w.sum()


def histogram(values: list) -> dict[str, int]:
    """How often each value occurs, by value (the chosen t of NTK evolutions: a row field and final.json)."""
    return {str(v): values.count(v) for v in sorted(set(values))}


def check_finite(ctx, round_index: int) -> None:
    """Stop every rank together, naming the peers, when a model holds NaN or inf."""
    rows = (~torch.isfinite(ctx.flat).all(1)).nonzero()[:, 0].tolist()  # one read of the device, not one a peer
    bad = [ctx.peers[i] for i in rows]
    gathered = ctx.transport.gather(bad)
    every = ctx.transport.bcast(sorted(p for part in gathered for p in part) if gathered is not None else None)
    if every:
        raise DivergenceError(
            f"round {round_index + 1}: peers {every[:20]}{' ...' if len(every) > 20 else ''} "
            f"have NaN/inf weights; lower --lr"
        )


def fault_fields(faults, round_index: int, peers: int, lost: int) -> dict:
    """Who took part in a round under simulated faults, and its simulated time."""
    everyone = range(peers)
    return {
        "offline": [p for p in everyone if faults.offline(round_index, p)],
        "stragglers": [
            p for p in faults.taking_part(round_index, everyone) if faults.finish_time(round_index, p) > 1.0
        ],
        "messages_lost": lost,
        "sim_time": faults.simulated_time(round_index, everyone),
    }


class MetricsLog:
    def __init__(self, ctx, run_dir: Path | None, centralized: bool, reported_model):
        self.ctx = ctx
        self.centralized = centralized
        self.reported_model = reported_model  # all peers' weights (P, D) -> the model the run reports (rank 0)
        self.path = run_dir / "metrics.jsonl" if run_dir is not None else None
        self.peers = PeerScores(ctx)
        self.rows: list[dict] = []
        self.last_weights: torch.Tensor | None = None  # every peer's weights at the last evaluation (rank 0)

    def restore(self, rows: list[dict]) -> None:
        """The rows so far (a resumed run's; none for a new one, rank 0): metrics.jsonl rewritten to hold
        exactly them. Called once the run is ready to go on, so a run that fails before keeps its file."""
        self.rows = list(rows)
        if self.path is not None:
            self.path.write_text("".join(json.dumps(row) + "\n" for row in rows))

    def record(self, round_index: int, result, train_s: float, round_start: float, evaluate_now: bool) -> dict | None:
        """The row of a round from what it returned (a Round), on rank 0 (None elsewhere), appended to
        metrics.jsonl. Its times: train_s, the algorithm's round; eval_s, this evaluation and gathering;
        round_s, all since round_start (the previous row), so that the rows' round_s add up to the loop."""
        ctx = self.ctx
        eval_start = time.perf_counter()
        check_finite(ctx, round_index)
        decentralized = not self.centralized
        sent, dense, lost = ctx.transport.counter.take()
        links = ctx.transport.counter.take_links()  # bytes per edge: a graph's diagnostic, not a star's
        rss, gpu = peak_rss_kib(), peak_gpu_mib(ctx.device)
        gathered = ctx.transport.gather(
            (sent, dense, rss, lost, links if decentralized else {}, gpu, gpu_identity(ctx.device))
        )
        losses = result.losses
        train = ctx.transport.gather_rows(losses[:, None].double()) if losses is not None else None
        custom = result.scores if evaluate_now else None
        weights, clients, client_error = (
            self.peers.evaluate_all() if evaluate_now and custom is None else (None, None, None)
        )
        if decentralized and not evaluate_now:  # consensus distance needs every round's weights
            weights = ctx.transport.gather_rows(ctx.flat.float())
        pooled = {name: ctx.transport.gather(values) for name, values in result.pooled.items()}
        if ctx.transport.rank != 0:
            return None
        row: dict = {"round": round_index + 1, **result.fields}
        if ctx.faults is not None:
            row.update(fault_fields(ctx.faults, round_index, ctx.cfg.peers, sum(g[3] for g in gathered)))
        aggregated: dict = {}
        if custom is not None:
            aggregated, clients = custom
        elif clients is not None:
            self.last_weights = weights
            model = self.reported_model(weights)[None]
            aggregated = {
                m: float(v[0]) for m, v in evaluate(ctx.stack, model, self.peers.test_x, self.peers.test_y).items()
            }
        row.update({f"test_{m}": float(v) for m, v in aggregated.items()})
        for m, v in (clients or {}).items():
            row.update(
                {
                    f"client_{m}_mean": float(v.mean()),
                    f"client_{m}_min": float(v.min()),
                    f"client_{m}_max": float(v.max()),
                }
            )
        if client_error is not None:
            row[f"client_{ctx.stack.task.headline}_se"] = round(client_error, 6)
        if clients is not None and weights is not None:
            row["variance"] = inter_model_variance(weights)
        if decentralized and weights is not None:
            row.update(
                round_diagnostics(
                    weights,
                    ctx.schedule.graph(round_index),
                    ctx.cfg.mixing,
                    ctx.sample_counts,
                    [g[4] for g in gathered],
                )
            )
        row.update({name: histogram([v for part in parts for v in part]) for name, parts in pooled.items()})
        train_loss = train_loss_of(train)
        if train_loss is not None:
            row["train_loss"] = train_loss  # the peers that trained this round
        phases, now = phase_bytes(gathered), time.perf_counter()
        row.update(
            bytes_sent=int(sum(phases.values())),
            bytes_dense=int(sum(sum(g[1].values()) for g in gathered)),
            bytes_by_phase=phases,
            train_s=round(train_s, 4),
            eval_s=round(now - eval_start, 4),
            round_s=round(now - round_start, 4),
            peak_rss_mb=round(sum(g[2] for g in gathered) / 1024),
        )
        gpu_peak = busiest_gpu_mib([(g[5], g[6]) for g in gathered])
        if gpu_peak is not None:
            row["peak_gpu_mb"] = round(gpu_peak)
        self.rows.append(row)
        if self.path is not None:
            append_line(self.path, json.dumps(row))
        return row


def train_loss_of(train: torch.Tensor | None) -> float | None:
    """The mean training loss over the peers that trained (NaN marks the others); None where none did."""
    if train is None or bool(train.isnan().all()):
        return None
    return float(train.nanmean())


def phase_bytes(gathered: list) -> dict[str, int]:
    """Bytes sent by phase, summed over the ranks' counters."""
    phases: dict[str, int] = {}
    for sent, *_ in gathered:
        for k, v in sent.items():
            phases[k] = phases.get(k, 0) + v
    return phases


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
