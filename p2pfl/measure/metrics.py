"""The metrics a run reports, each declared once (`declare_metric`): its keys, meaning, unit, whether it
is a fact of the machine, and how rank 0 computes it from the round's facts (p2pfl.measure.facts). The
rows of metrics.jsonl, the docs' table and the list of machine facts are all derived from the
declarations; an algorithm declares the fields its rounds add.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from p2pfl.measure.graph_diagnostics import edge_bytes, graph_gap
from p2pfl.measure.facts import RoundFacts, busiest_gpu_mib, consensus_distance, fault_fields, histogram

__all__ = ["METRICS", "Metric", "declare_metric", "machine_facts", "read_metrics", "rounds_to_target"]


@dataclass(frozen=True)
class Metric:
    """A metric: the row keys it writes, what they mean and in which unit; machine: a fact of the machine
    (times, memory), left out where runs are compared for equal results; value: its value(s) on rank 0
    from the round's facts (a number, or {key: value} for several keys; None: absent this round), or
    None where the algorithm writes it (Round.fields, Round.pooled)."""

    keys: tuple[str, ...]
    meaning: str
    unit: str
    machine: bool = False
    value: Callable[[RoundFacts], Any] | None = None


METRICS: dict[str, Metric] = {}  # by first key, in declaration order: the row's and the table's order


def declare_metric(*keys: str, meaning: str, unit: str, machine: bool = False, value=None) -> Metric:
    """Declare a metric (once: the same first key again replaces it, as a re-imported module does)."""
    if not keys or any(not isinstance(k, str) or not k for k in keys):
        raise ValueError(f"declare_metric needs its row keys as strings, not {keys!r}")
    METRICS[keys[0]] = metric = Metric(tuple(keys), meaning, unit, machine, value)
    return metric


def machine_facts() -> tuple[str, ...]:
    """Every key that is a fact of the machine: how the run went here, not its results."""
    return tuple(k for m in METRICS.values() if m.machine for k in m.keys)


def declared_keys() -> set[str]:
    return {k for m in METRICS.values() for k in m.keys}


def build_row(facts: RoundFacts, fields: dict) -> dict:
    """The row of a round: each declared metric's value(s) in declaration order, the algorithm's fields
    after the round, and the pooled lists as histograms."""
    row: dict = {}
    for metric in METRICS.values():
        value = metric.value(facts) if metric.value is not None else None
        if isinstance(value, dict):
            row.update(value)
        elif value is not None:
            row[metric.keys[0]] = value
        if metric.keys[0] == "round":
            row.update(fields)
            row.update({name: histogram(values) for name, values in pooled(facts).items()})
    return row


def pooled(facts: RoundFacts) -> dict[str, list]:
    names = [name for rank in facts.ranks for name in rank.pooled]
    return {name: [v for rank in facts.ranks for v in rank.pooled.get(name, [])] for name in dict.fromkeys(names)}


BAR = "\\|"  # a | inside a table cell


def metrics_table() -> str:
    """docs/cli.md's table of the metrics.jsonl keys, from the declarations."""
    lines = ["| key | meaning | unit |", "|---|---|---|"]
    for m in METRICS.values():
        keys = ", ".join(f"`{k}`" for k in m.keys)
        meaning = m.meaning + (" (a fact of the machine: left out where runs are compared)" if m.machine else "")
        lines.append(f"| {keys} | {meaning.replace('|', BAR)} | {m.unit.replace('|', BAR)} |")
    return "\n".join(lines)


def client_fields(facts: RoundFacts) -> dict:
    """Each client metric's mean over the peers, and its minimum and maximum where every peer was scored
    on every test sample: the extremes of scores on small subsets are biased (the minimum of noisy
    estimates is low), so those are left out. A personal test set is its metric's whole definition."""
    out = {}
    for m, v in (facts.clients or {}).items():
        out[f"client_{m}_mean"] = float(v.mean())
        if facts.client_se is None or m == "personal_acc":
            out.update({f"client_{m}_min": float(v.min()), f"client_{m}_max": float(v.max())})
    return out


def train_loss(facts: RoundFacts) -> float | None:
    """The mean training loss over the peers that trained (NaN marks the others); None where none did."""
    if all(rank.losses is None for rank in facts.ranks):
        return None
    losses = torch.tensor(facts.joined("losses"), dtype=torch.float64)
    return None if bool(losses.isnan().all()) else float(losses.nanmean())


def graph_only(compute):
    """A metric of a graph run's round: absent on a star."""
    return lambda f: compute(f) if f.graph is not None else None


declare_metric("round", meaning="the round, counted from 1", unit="count", value=lambda f: f.round_index + 1)
declare_metric(
    "test_acc",
    "test_loss",
    meaning="the aggregated model on the whole test set (`--test-samples`): a star's server model; on a graph "
    "the `--aggregate` average of all peers' weights (DisPFL: its mask-wise average). Regression tasks "
    "report `test_loss` only",
    unit="fraction; cross-entropy in nats (regression: the task's loss)",
    value=lambda f: {f"test_{m}": float(v) for m, v in f.aggregated.items()},
)
declare_metric(
    "offline",
    "stragglers",
    "messages_lost",
    "sim_time",
    meaning="with faults: the peers offline this round, those past the deadline, messages dropped, the round's "
    "simulated time",
    unit="peers; count; simulated time units",
    value=lambda f: (
        fault_fields(f.faults, f.round_index, f.peers, sum(r.messages_lost for r in f.ranks))
        if f.faults is not None
        else None
    ),
)
declare_metric(
    "client_acc_mean",
    "client_acc_min",
    "client_acc_max",
    "client_loss_mean",
    "client_loss_min",
    "client_loss_max",
    meaning="each peer's own model on its own client test samples: `--client-test-samples` of the test set "
    "(default 62,500 / peers, at most all), drawn from `--seed` and the peer, each class in its share. The "
    "minimum and maximum are written only where every client is scored on every test sample "
    "(`--client-test-samples 0`, or a set no larger than the subset): on a subset they would be biased, the "
    "lowest of noisy scores lower than the lowest true one",
    unit="fraction; nats",
    value=client_fields,
)
declare_metric(
    "client_acc_se",
    "client_loss_se",
    meaning="standard error of `client_acc_mean` against the same mean over the whole test set: the root "
    "of the sum over peers of each score's stratified sampling variance, over the number of peers (the "
    "peers' draws are independent, so it falls as peers are added); absent where every client sees every "
    "test sample. Regression tasks: `client_loss_se`, of the mean loss",
    unit="fraction",
    value=lambda f: {f"client_{f.headline}_se": round(f.client_se, 6)} if f.client_se is not None else None,
)
declare_metric(
    "client_personal_acc_mean",
    "client_personal_acc_min",
    "client_personal_acc_max",
    meaning="classification: each peer's own model on its personal test set, ceil(test images / peers) images "
    "drawn, seeded per peer, with the label proportions of its training shard (DisPFL's personalized accuracy)",
    unit="fraction",
)  # written with the other client metrics
declare_metric(
    "variance",
    meaning="inter-model variance (NTK-DFL eq. 6): the mean over parameters of the root of the summed squared "
    "deviations from the mean model",
    unit="weight units",
    value=lambda f: f.variance,
)
declare_metric(
    "grad_norm",
    meaning="--grad-norm: the objective's gradient norm at the peers' mean model (the objective: the mean over "
    "peers of each one's mean loss over its whole shard, weight decay included), in evaluated rounds; 0 at a "
    "convex problem's optimum",
    unit="loss per weight",
    value=lambda f: f.grad_norm,
)
declare_metric(
    "sim_time_s",
    meaning="the virtual seconds since the run began, after the round (p2pfl.comm.clock): each round's local work "
    "(--step-time per step; without it 1 s a round, the faults' unit clock) and then its messages (--link-latency "
    "plus bytes over --link-bandwidth, a graph edge's own latency and bandwidth first), until the last "
    "participant is done",
    unit="virtual seconds",
    value=lambda f: f.sim_time_s,
)
declare_metric(
    "dp_epsilon",
    meaning="--dp-clip: the largest epsilon an honest peer has spent, at --dp-delta, after the round (its DP-SGD "
    "steps composed by dp-accounting's RDP accountant), in evaluated rounds",
    unit="epsilon at --dp-delta",
)  # written by the run's privacy ledger (p2pfl.threats.privacy)
declare_metric(
    "dp_epsilon_network",
    meaning="--dp-clip with K > 1 gossip steps a round on one graph (--algo muffliato, Cyffers et al. 2022, or "
    "--gossip-steps for dpsgd, dfedavg, dfedavgm): pairwise network DP, the mean over ordered pairs of peers u != v "
    "of the epsilon at --dp-delta of what v hears about u over the K gossip steps after each of u's noised steps "
    "(the paper's count), in evaluated rounds",
    unit="epsilon at --dp-delta",
)  # written by the run's privacy ledger too
declare_metric(
    "consensus_distance",
    meaning="decentralized, every round: the mean over peers (the honest ones under --byzantine, as every "
    "metric) of the squared distance of a peer's weights to their average, after the round (one pass over the peers' weights beside the sum every round takes to find "
    "NaN; the drift stop reads it)",
    unit="squared weight units",
    value=graph_only(lambda f: consensus_distance(sum(r.spread for r in f.ranks), f.peers)),
)
declare_metric(
    "spectral_gap",
    meaning="decentralized: 1 - ||W - 11^T/n||_2 of the round's `--mixing` matrix W where it is doubly stochastic "
    "(1 - max(|lambda_2|, |lambda_n|) for a symmetric W; 0: disconnected; 1: one averaging reaches consensus); "
    "absent where W is not doubly stochastic (it averages to a weighted mean); computed once for a graph that "
    "does not change",
    unit="number in [0, 1]",
    value=graph_only(lambda f: graph_gap(f.graph, f.mixing, f.sample_counts)),
)
declare_metric(
    "edge_bytes_min",
    "edge_bytes_mean",
    "edge_bytes_max",
    meaning="decentralized: bytes over each edge of the round's graph, both directions and every phase (an edge "
    "between two offline peers counts 0)",
    unit="bytes",
    value=graph_only(lambda f: edge_bytes(f.graph, f.summed("links"))),
)
declare_metric(
    "train_loss",
    meaning="the mean over the peers that trained this round of each one's training loss: the mean of its "
    "minibatch losses over the round's local steps, each taken before its step (D-PSGD: its one minibatch; "
    "NTK-DFL: the chosen weights' loss on the neighbourhood's pooled samples)",
    unit="nats (regression: the task's loss)",
    value=train_loss,
)
declare_metric(
    "bytes_sent",
    "bytes_dense",
    "bytes_by_phase",
    meaning="bytes all peers sent this round; what they would be uncompressed; `bytes_sent` by message phase",
    unit="bytes",
    value=lambda f: {
        "bytes_sent": int(sum(f.summed("bytes_by_phase").values())),
        "bytes_dense": int(sum(f.summed("bytes_dense").values())),
        "bytes_by_phase": f.summed("bytes_by_phase"),
    },
)
declare_metric(
    "train_s",
    meaning="the algorithm's round: local training and exchanges (on a GPU its queued work included)",
    unit="s",
    machine=True,
    value=lambda f: round(f.train_s, 4),
)
declare_metric(
    "eval_s",
    meaning="this round's evaluation, gathering and metrics",
    unit="s",
    machine=True,
    value=lambda f: round(f.now - f.eval_start, 4),
)
declare_metric(
    "round_s",
    meaning="the round's whole time, from the previous row to this one: training, evaluation, checkpoint and "
    "files; the rows' `round_s` add up to the run's loop. The progress bar's rate and `analysis compare`'s "
    "time panel and `s_per_round` use it",
    unit="s",
    machine=True,
    value=lambda f: round(f.now - f.round_start, 4),
)
declare_metric(
    "peak_rss_mb",
    meaning="peak resident memory so far, summed over ranks (each rank's VmHWM on Linux; ru_maxrss would carry "
    "over the peak of the process that started the run)",
    unit="MiB",
    machine=True,
    value=lambda f: round(sum(r.peak_rss_kib for r in f.ranks) / 1024),
)
declare_metric(
    "peak_gpu_mb",
    meaning="on a GPU: the high-water marks of the memory torch's allocator reserved (tensors, its cache, "
    "fragmentation; not the CUDA context of a few hundred MiB a process) summed over the ranks that share a "
    "GPU, for the busiest GPU (what must fit on it)",
    unit="MiB",
    machine=True,
    value=lambda f: (
        None if (peak := busiest_gpu_mib([(r.peak_gpu_mib, r.gpu) for r in f.ranks])) is None else round(peak)
    ),
)


class MetricsLog:
    """The rows so far and metrics.jsonl (rank 0's; path None: no file). A row is kept at once and written
    by flush(), which the loop calls once the round is captured for a stop: a row a user reads in the file
    is of a round a stop saves."""

    def __init__(self, path: Path | None):
        self.path = path
        self.rows: list[dict] = []
        self.written = 0  # rows in the file

    def restore(self, rows: list[dict]) -> None:
        """The rows so far (a resumed run's; none for a new one, rank 0): metrics.jsonl rewritten to hold
        exactly them. Called once the run is ready to go on, so a run that fails before keeps its file."""
        self.rows = list(rows)
        if self.path is not None:
            self.path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        self.written = len(self.rows)

    def append(self, row: dict) -> None:
        self.rows.append(row)

    def flush(self) -> None:
        """The rows not yet in metrics.jsonl appended to it; counted as written first, so that a stop at
        once during a write never writes a row twice (the checkpoint holds it; a resume rewrites the file)."""
        while self.path is not None and self.written < len(self.rows):
            self.written += 1
            append_line(self.path, json.dumps(self.rows[self.written - 1]))


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
