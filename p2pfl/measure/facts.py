"""What a round leaves to measure, in plain values: each rank's facts (RankFacts), gathered to rank 0
once a round, and there the round's facts (RoundFacts) that every declared metric is computed from
(p2pfl.measure.metrics). Nothing here holds a peer's weights: they reach rank 0 as sums over the peers."""

from __future__ import annotations

import functools
import resource
import socket
import time
from dataclasses import dataclass, field

import networkx as nx
import torch


@dataclass(frozen=True)
class RankFacts:
    """One rank's part of a round: its transport counters, its memory, and its peers' numbers in peer
    order (the rank's peers are consecutive, so the ranks' lists joined in rank order are in peer order)."""

    bytes_by_phase: dict[str, int]
    bytes_dense: dict[str, int]
    messages_lost: int
    links: dict[tuple[int, int], int]  # bytes per edge (a graph run's; empty on a star)
    peak_rss_kib: int
    peak_gpu_mib: float | None  # None off a GPU
    gpu: str | None  # which physical GPU (ranks sharing one report the same)
    losses: list[float] | None  # each peer's training loss (NaN: it did not train); None: none reported
    pooled: dict[str, list] = field(default_factory=dict)  # lists joined over the ranks (NTK-DFL's chosen t)
    spread: float | None = None  # sum over its peers of ||w_i - wbar||^2 (a graph run's)
    scores: dict[str, list[float]] = field(default_factory=dict)  # an evaluated round: each peer's client metrics
    score_variances: list[float] = field(default_factory=list)  # and the sampling variance of its headline score
    exchanges: list = field(default_factory=list)  # each exchange's (src, dst, bytes) that arrived (the clock's)


@dataclass
class RoundFacts:
    """A round on rank 0: every rank's facts and what the run computed from the peers' sums."""

    round_index: int
    ranks: list[RankFacts]
    peers: int
    headline: str  # the task's headline metric (acc, or loss for regression)
    graph: nx.Graph | None = None  # the round's graph (a graph run), with its mixing and sample counts
    mixing: str = ""
    sample_counts: list[int] = field(default_factory=list)
    faults: object | None = None  # the run's simulated faults (p2pfl.comm.faults.Faults), where any are asked for
    aggregated: dict[str, float] = field(default_factory=dict)  # the reported model's test metrics
    clients: dict[str, torch.Tensor] | None = None  # each peer's client metrics in peer order (float64)
    client_se: float | None = None  # standard error of the peers' mean headline score
    variance: float | None = None  # NTK-DFL eq. (6)
    grad_norm: float | None = None  # --grad-norm: the objective's gradient norm at the peers' mean model
    train_s: float = 0.0
    eval_start: float = 0.0  # perf_counter() when measuring began
    round_start: float = 0.0  # perf_counter() at the previous row
    sim_time_s: float | None = None  # the virtual seconds since the run began, after this round

    def joined(self, name: str) -> list:
        """An attribute's lists joined over the ranks, in peer order."""
        return [v for rank in self.ranks for v in (getattr(rank, name) or [])]

    def summed(self, name: str) -> dict:
        """An attribute's dicts summed key by key over the ranks."""
        total: dict = {}
        for rank in self.ranks:
            for k, v in getattr(rank, name).items():
                total[k] = total.get(k, 0) + v
        return total

    @functools.cached_property
    def now(self) -> float:
        """The clock at the row's end: read once, so that eval_s and round_s end together."""
        return time.perf_counter()


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


def inter_model_variance(deviations: torch.Tensor) -> float:
    """NTK-DFL eq. (6), V = (1/d) sum_j sqrt(sum_i (wbar_j - w_ij)^2), from the summed squared deviations."""
    value = float(deviations.sqrt().mean())
    return float(f"{value:.10g}")  # the last bits of a long float64 sum depend on the thread count


def consensus_distance(spread: float, peers: int) -> float:
    """(1/n) sum_i ||w_i - wbar||^2 from its sum over the peers."""
    return float(f"{spread / peers:.10g}")


def histogram(values: list) -> dict[str, int]:
    """How often each value occurs, by value (the chosen t of NTK evolutions: a row field and final.json)."""
    return {str(v): values.count(v) for v in sorted(set(values))}


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


def merged_exchanges(ranks: list[RankFacts]) -> list[list[tuple[int, int, int]]]:
    """The round's exchanges in order, each with every rank's messages (the ranks make the same exchanges)."""
    count = max((len(r.exchanges) for r in ranks), default=0)
    return [[m for r in ranks if i < len(r.exchanges) for m in r.exchanges[i]] for i in range(count)]
