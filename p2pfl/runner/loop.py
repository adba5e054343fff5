"""The round loop: round k, its row, what observes it (the edges file, TensorBoard, the progress bar),
the checkpoint turn; after the last round the algorithm's closing results, the reported model and the
summary line."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from p2pfl.algorithms.base import check_round_result
from p2pfl.plugins import call_hook
from p2pfl.runner.checkpoint.policy import Checkpoints, resume_hint
from p2pfl.runner.graph_schedule import check_same_graph
from p2pfl.stopping import StopRequest
from p2pfl.errors import Interrupted
from p2pfl.runner.round_row import RoundMeasure, sum_rows
from p2pfl.runner.run_folder import plot_rows, save_final, summary_line
from p2pfl.measure.graph_diagnostics import run_gap
from p2pfl.measure.tensorboard_log import TensorBoardLog


def run_rounds(ctx, algorithm, measure: RoundMeasure, first: int, run_dir: Path | None, write: bool):
    """Rounds first.. to the last on this rank; returns (final.json's results, the model's state dict) on
    rank 0. A stop (Interrupted) saves what the run holds; the plot of the rows so far is drawn anyway."""
    cfg, rank = ctx.cfg, ctx.transport.rank
    measure.privacy = algorithm.privacy_ledger()  # what DP-SGD spends (--dp-clip), in each evaluated row
    measure.work_steps = [algorithm.work_steps(len(s)) for s in ctx.shards]  # what the virtual clock times
    observers = watching(ctx, run_dir, first, write)
    saves = Checkpoints(ctx, algorithm, run_dir, write, first)
    stop = StopRequest(rank, ctx.transport.announce_stop)
    if stop.handles_signals:  # another rank's stop at once stops this one too
        ctx.transport.watch_for_stops(stop.on_remote_stop)
    shape, dtype, k = tuple(ctx.flat.shape), ctx.flat.dtype, first
    round_start = time.perf_counter()  # each row's round_s runs from the previous row: the rows add up to the loop
    try:
        for k in range(first, cfg.rounds):
            ctx.transport.round_index = k
            if ctx.faults is not None and ctx.faults.availability is not None:  # churn asks at the round's start
                ctx.faults.availability.round_starts[k] = ctx.transport.bcast(
                    measure.log.rows[-1]["sim_time_s"] if measure.log.rows else 0.0
                )
            check_same_graph(ctx, k, first)
            synchronize(ctx.device)
            start = time.perf_counter()
            result = check_round_result(algorithm, ctx, k, call_hook(algorithm, "round", k), shape, dtype)
            synchronize(ctx.device)  # the round's queued GPU work is part of its time
            evaluated = ctx.evaluates(k)
            model = reported_model(ctx, algorithm) if evaluated and result.scores is None else None
            row = measure.record(k, result, model, (time.perf_counter() - start, round_start), evaluated)
            round_start = time.perf_counter()
            if k < cfg.rounds - 1:
                saves.hold(k, measure.log.rows, result.resumable)
            measure.log.flush()  # after the capture: a row in the file is of a round a stop saves
            for observer in observers:
                observer.observe(k, row)
            if k < cfg.rounds - 1:
                saves.after_round(k, measure.log.rows, result.resumable, stop.requested, measure.drift)
        final = call_hook(algorithm, "finish", run_dir if rank == 0 else None)
        gap = run_gap(measure.log.rows, period_of(ctx), ctx.cfg.mixing, ctx.sample_counts) if rank == 0 else None
        if gap is not None:  # how fast the run's graph mixes: every bound of the field is stated in it
            final = {**(final or {}), "spectral_gap": gap}
        if rank == 0 and measure.log.rows:  # the virtual clock's total
            final = {**(final or {}), "sim_time_s": measure.log.rows[-1]["sim_time_s"]}
        if measure.privacy is not None and rank == 0:  # the privacy the run spent (--dp-clip)
            final = {**(final or {}), **measure.privacy.final(cfg.rounds)}
        state = final_model(measure, ctx) if rank == 0 else None
        if rank == 0:
            ending = summary_line(measure.log.rows, ctx.stack.task, run_dir)
            if write:
                save_final(run_dir, final, state)
            print(ending, file=sys.stderr)
        return final, state
    except KeyboardInterrupt:
        saved = saves.save_held()
        raise Interrupted(f"stopped in round {k + 1} by {stop.by}; {resume_hint(run_dir, saved)}", stop.code) from None
    finally:
        with contextlib.suppress(OSError):  # a stop at once between a row and its write (a full disk says so above)
            measure.log.flush()
        ctx.transport.stop_watching()
        stop.uninstall()
        for observer in observers:
            observer.close()
        if rank == 0 and measure.log.rows and write:
            plot_rows(cfg, measure.log.rows, ctx.stack.task, run_dir)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work: a clock read before it on a GPU measures the launches only."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def period_of(ctx) -> list | None:
    """One period of the rounds' graphs for a graph that changes by design (one-peer exponential), for
    final.json's gap; None for any other graph and for a star."""
    period = ctx.schedule.family.period
    if period is None or ctx.cfg.algorithm.centralized:
        return None
    return [ctx.schedule.graph(k) for k in range(period(ctx.schedule.n))]


def watching(ctx, run_dir: Path | None, first: int, write: bool) -> list:
    """The loop's observers on this rank: rank 0 writes the edges file and TensorBoard's log where asked
    (into the run folder) and draws the progress bar."""
    cfg, root = ctx.cfg, ctx.transport.rank == 0
    edges = EdgesFile(ctx, run_dir, first) if root and cfg.save_edges and write else None
    board = Board(run_dir) if root and cfg.tensorboard and write else None
    return [o for o in (edges, board) if o is not None] + [ProgressBar(ctx, first, root and cfg.progress)]


class EdgesFile:
    """edges.jsonl: each round's graph (--save-edges); a resumed run's rewritten to the rounds done."""

    def __init__(self, ctx, run_dir: Path, first: int):
        self.ctx, self.path = ctx, run_dir / "edges.jsonl"
        if ctx.cfg.resume:
            self.path.write_text("".join(edges_line(ctx, k) for k in range(first)))

    def observe(self, k: int, row: dict | None) -> None:
        with self.path.open("a") as fh:
            fh.write(edges_line(self.ctx, k))

    def close(self) -> None:
        pass


def edges_line(ctx, k: int) -> str:
    """edges.jsonl's line of round k: its graph's edges."""
    return json.dumps({"round": k + 1, "edges": sorted(ctx.schedule.graph(k).edges)}) + "\n"


class Board(TensorBoardLog):
    """TensorBoard's log of the rows (--tensorboard)."""

    def observe(self, k: int, row: dict | None) -> None:
        if row:
            self.add(row)


class ProgressBar:
    """Rounds done, with the last evaluation's aggregated and mean client headline metric."""

    def __init__(self, ctx, first: int, shown: bool):
        self.task = ctx.stack.task
        self.bar = tqdm(
            desc=f"{ctx.cfg.algo} {ctx.cfg.peers} peers",
            disable=not shown,
            unit="round",
            file=sys.stderr,
            initial=first,
            total=ctx.cfg.rounds,
        )

    def observe(self, k: int, row: dict | None) -> None:
        head = self.task.headline
        if row and f"test_{head}" in row:
            self.bar.set_postfix(
                {head: self.task.format(row[f"test_{head}"]), "clients": self.task.format(row[f"client_{head}_mean"])},
                refresh=False,
            )
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def reported_model(ctx, algorithm) -> torch.Tensor | None:
    """The model a run reports, on rank 0: a star's server model; on a graph, the peers' weights averaged
    coordinate by coordinate with the algorithm's coefficients (Algorithm.aggregate_coefficients; None:
    --aggregate's), as one sum over the ranks: no rank holds every peer's weights."""
    if algorithm.centralized:
        return ctx.global_weights
    a = call_hook(algorithm, "aggregate_coefficients", ctx.flat)
    if a is None and ctx.cfg.aggregate != "uniform":
        a = torch.tensor([float(ctx.sample_counts[p]) for p in ctx.peers], device=ctx.flat.device)
    if a is None:
        a = torch.ones(len(ctx.peers), device=ctx.flat.device)
    if ctx.threats is not None and ctx.threats.attackers:  # the honest peers' average: attackers weigh 0
        keep = torch.tensor([p not in ctx.threats.attackers for p in ctx.peers], device=a.device)
        a = a * (keep[:, None] if a.dim() == 2 else keep).to(a.dtype)
    weight = a.double().sum(0) if a.dim() == 2 else a.double().sum()[None]
    total = ctx.transport.reduce(torch.cat([sum_rows(ctx.flat, a), weight]))
    if total is None:
        return None
    num, den = total[: ctx.flat.shape[1]], total[ctx.flat.shape[1] :]
    return torch.where(den > 0, num / den, torch.zeros_like(num)).to(ctx.flat.dtype)


def final_model(measure: RoundMeasure, ctx) -> dict[str, torch.Tensor] | None:
    """The reported model's state dict on the CPU (rank 0), where a round was evaluated or a star's
    server holds it."""
    model = ctx.global_weights if ctx.global_weights is not None else measure.last_model
    if model is None:
        return None
    return {k: v.cpu().clone() for k, v in ctx.stack.layout.views(model).items()}  # loadable anywhere
