"""A round's row: this rank's facts (p2pfl.measure.facts) and the peers' weights as sums over the peers,
so that no rank ever holds every peer's weights; gathered once to rank 0, where each declared metric
(p2pfl.measure.metrics) is computed. A round that is not evaluated costs one sum over the ranks and one gather.
"""

from __future__ import annotations

import time

import torch

from p2pfl.errors import DivergenceError
from p2pfl.measure.drift import drift_line
from p2pfl.threats.privacy import PrivacyLedger
from p2pfl.measure.optimality import objective_gradient_sum
from p2pfl.measure.scoring import PeerScores
from p2pfl.local.forward import evaluate
from p2pfl.measure.metrics import MetricsLog, build_row
from p2pfl.measure.facts import (
    RankFacts,
    RoundFacts,
    gpu_identity,
    inter_model_variance,
    merged_exchanges,
    peak_gpu_mib,
    peak_rss_kib,
)


ROW_BLOCK = 2**22  # float64 entries (32 MiB) of the peers' weights taken at once


def row_blocks(rows: torch.Tensor):
    """(first row, block): rows (L, D) in blocks of whole rows of about ROW_BLOCK float64 entries, as
    float64 copies of their own."""
    step = max(1, ROW_BLOCK // max(1, rows.shape[1]))
    for i in range(0, len(rows), step):
        yield i, rows[i : i + step].to(torch.float64, copy=True)


def sum_rows(rows: torch.Tensor, coefficients: torch.Tensor | None = None) -> torch.Tensor:
    """(D,) float64: sum_i a_i * w_i over rows w_i, a_i a row's coefficient (a number, or one per
    coordinate); None: all 1. In blocks: never an L x D float64 copy."""
    total = torch.zeros(rows.shape[1], dtype=torch.float64, device=rows.device)
    for first, block in row_blocks(rows):
        if coefficients is None:
            total += block.sum(0)
        else:
            a = coefficients[first : first + len(block)].double()
            total += (a if a.dim() == 2 else a[:, None]).mul(block).sum(0)
    return total


def squared_deviations(rows: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    """(D,) float64: sum_i (w_ij - mean_j)^2 over rows w_i, coordinate by coordinate."""
    total = torch.zeros(rows.shape[1], dtype=torch.float64, device=rows.device)
    for _, block in row_blocks(rows):
        total += block.sub_(mean).square_().sum(0)  # block is a float64 copy of its own
    return total


class RoundMeasure:
    """Each round's row, from the rank's facts; rank 0 keeps the rows (MetricsLog) and the model it
    reported at the last evaluation."""

    def __init__(self, ctx, log: MetricsLog, privacy: PrivacyLedger | None = None):
        self.ctx, self.log, self.privacy = ctx, log, privacy
        self.graph_run = not ctx.cfg.algorithm.centralized
        count = ctx.cfg.test_samples or len(ctx.data.test_y)  # --test-samples: every evaluation's
        self.test = ctx.data.test_x[:count], ctx.data.test_y[:count]
        # DisPFL's personal test sets follow each peer's training labels (classification)
        labels = [ctx.samples(p)[1] for p in ctx.peers] if ctx.stack.task.name == "classification" else None
        self.peer_scores = PeerScores(
            ctx.stack,
            (ctx.data.test_x, ctx.data.test_y),
            count,
            (ctx.peers, ctx.cfg.peers),
            ctx.cfg.client_test_samples,
            ctx.cfg.seed,
            (labels, ctx.data.n_classes) if labels is not None else None,
        )
        self.last_model: torch.Tensor | None = None  # rank 0
        self.work_steps = [1] * ctx.cfg.peers  # each peer's local steps a round (the run sets its algorithm's)
        self.drift: str | None = None  # rank 0: the line of peers drifting apart, once they do
        self.drift_step = (
            "--choco-gamma (the consensus step) or --lr" if hasattr(ctx.cfg.settings, "choco_gamma") else "--lr"
        )
        # Byzantine peers are left out of every metric: the rows of this rank's honest peers, and their count
        threats = ctx.threats
        self.honest = threats.honest_rows(ctx.peers) if threats is not None and threats.attackers else None
        self.counted = ctx.cfg.peers - (len(threats.attackers) if self.honest is not None else 0)

    def measured(self, rows: torch.Tensor) -> torch.Tensor:
        """The honest peers' rows (all rows where no peer is Byzantine)."""
        return rows if self.honest is None else rows[self.honest]

    def record(self, k: int, result, model: torch.Tensor | None, times: tuple[float, float], evaluated: bool):
        """The row of round k from what it returned (a Round) and the model it reports (rank 0's, where
        evaluated), appended to the log on rank 0 (None elsewhere). times: (train_s, the previous row's
        clock), so that the rows' round_s add up to the loop."""
        ctx, eval_start = self.ctx, time.perf_counter()
        scored = evaluated and result.scores is None  # TCT's stage 2 scores its own model
        mean = self.peers_mean(k, self.graph_run or scored)
        deviations = squared_deviations(self.measured(ctx.flat), mean) if mean is not None else None
        scores, variances = self.peer_scores.local_scores(ctx.flat) if scored else ({}, None)
        if self.honest is not None:
            scores = {m: v[self.honest] for m, v in scores.items()}
            variances = variances[self.honest] if variances is not None else None
        summed = slope = None
        if scored:  # the deviations and --grad-norm's gradient summed over the ranks in one collective
            parts = [deviations, *([self.objective_gradient(mean)] if ctx.cfg.grad_norm else [])]
            total = ctx.transport.reduce(torch.cat(parts))
            if total is not None:
                summed, slope = total[: len(deviations)], total[len(deviations) :]
        facts = ctx.transport.gather(self.rank_facts(result, deviations, scores, variances))
        if facts is None:
            return None
        round_facts = self.round_facts(k, facts, times[0], eval_start, times[1], result.seconds)
        if scored:
            self.score_model(round_facts, model, summed)
            if ctx.cfg.grad_norm:
                round_facts.grad_norm = float(f"{float((slope / self.counted).norm()):.10g}")  # as the other sums
        elif evaluated:
            round_facts.aggregated, clients = result.scores
            round_facts.clients = {m: torch.as_tensor(v, dtype=torch.float64) for m, v in clients.items()}
        fields = (
            {**result.fields, **self.privacy.row(k + 1)} if self.privacy is not None and evaluated else result.fields
        )
        row = build_row(round_facts, fields)
        self.log.append(row)
        self.drift = drift_line(self.log.rows, self.drift_step) if ctx.cfg.drift_stop else None
        return row

    def peers_mean(self, k: int, wanted: bool) -> torch.Tensor | None:
        """The peers' mean weights (where wanted), on every rank, from one sum over the ranks; every rank
        stops together where a peer's weights hold NaN or inf. The sum tells: a non-finite weight makes
        its coordinate's float64 sum non-finite, and finite float32 weights cannot overflow it."""
        ctx = self.ctx
        rows = self.measured(ctx.flat)
        if wanted:
            total = ctx.transport.allreduce(sum_rows(rows))
            bad = not bool(torch.isfinite(total).all())
        else:
            count = (~torch.isfinite(rows).all(1)).sum().double()[None]
            bad = bool(ctx.transport.allreduce(count)[0] > 0)
        if bad:
            diverged(ctx, k)
        return total / self.counted if wanted else None

    def objective_gradient(self, mean: torch.Tensor) -> torch.Tensor:
        """This rank's peers' share of the objective's gradient at the peers' mean model (--grad-norm)."""
        ctx = self.ctx
        data = ctx.data.train_x, ctx.data.train_y
        model = mean.to(ctx.flat.dtype)
        peers = ctx.peers if self.honest is None else [ctx.peers[i] for i in self.honest]
        return objective_gradient_sum(ctx.stack, model, [ctx.indices(p) for p in peers], data, ctx.cfg.weight_decay)

    def rank_facts(self, result, deviations, scores: dict, variances: torch.Tensor | None) -> RankFacts:
        ctx, counter = self.ctx, self.ctx.transport.counter
        sent, dense, lost = counter.take()
        links = counter.take_links()  # bytes per edge: a graph's diagnostic, not a star's
        return RankFacts(
            bytes_by_phase=sent,
            bytes_dense=dense,
            messages_lost=lost,
            links=links if self.graph_run else {},
            peak_rss_kib=peak_rss_kib(),
            peak_gpu_mib=peak_gpu_mib(ctx.device),
            gpu=gpu_identity(ctx.device),
            losses=self.measured(result.losses).double().tolist() if result.losses is not None else None,
            pooled=result.pooled,
            spread=float(deviations.sum()) if self.graph_run else None,
            scores={m: v.tolist() for m, v in scores.items()},
            score_variances=variances.tolist() if variances is not None else [],
            exchanges=counter.take_exchanges(),
        )

    def round_facts(
        self, k: int, facts: list[RankFacts], train_s: float, eval_start: float, round_start: float, seconds=None
    ):
        ctx = self.ctx
        return RoundFacts(
            round_index=k,
            ranks=facts,
            peers=self.counted,
            headline=ctx.stack.task.headline,
            graph=ctx.schedule.graph(k) if self.graph_run else None,
            mixing=ctx.cfg.mixing,
            sample_counts=ctx.sample_counts,
            faults=ctx.faults,
            train_s=train_s,
            eval_start=eval_start,
            round_start=round_start,
            sim_time_s=self.clock(k, facts, seconds),
        )

    def clock(self, k: int, facts: list[RankFacts], seconds: float | None = None) -> float:
        """The virtual seconds since the run began after round k (p2pfl.comm.clock): the last row's (a
        resumed run's rows come back with it) plus this round's: the seconds an asynchronous round spans,
        else its work timed at the round's start and then its exchanges."""
        before = self.log.rows[-1]["sim_time_s"] if self.log.rows else 0.0
        if seconds is not None:
            return float(f"{before + seconds:.10g}")
        ctx, network = self.ctx, self.ctx.network
        faults = ctx.faults
        taking_part = range(ctx.cfg.peers) if faults is None else faults.taking_part(k, range(ctx.cfg.peers))
        work = {
            p: network.work(p, self.work_steps[p], faults.finish_time(k, p) if faults is not None else 1.0)
            for p in taking_part
        }
        deadline = faults.deadline if faults is not None and faults.faulty and network.step_times is None else None
        graph = ctx.schedule.graph(k) if self.graph_run else None
        seconds = network.round_time(work, merged_exchanges(facts), graph, deadline)
        return float(f"{before + seconds:.10g}")

    def score_model(self, facts: RoundFacts, model: torch.Tensor, deviations: torch.Tensor) -> None:
        """An evaluated round on rank 0: the reported model on the whole test set, the peers' scores and
        the precision of their mean, the inter-model variance."""
        ctx = self.ctx
        self.last_model = model
        scores = evaluate(ctx.stack, model[None], *self.test)  # on the run's device, as the weights it sums
        facts.aggregated = {m: float(v[0]) for m, v in scores.items()}
        facts.clients = {
            m: torch.tensor([v for rank in facts.ranks for v in rank.scores[m]], dtype=torch.float64)
            for m in facts.ranks[0].scores
        }
        if self.peer_scores.sampled:
            facts.client_se = float(sum(facts.joined("score_variances"))) ** 0.5 / facts.peers
        facts.variance = inter_model_variance(deviations)


def diverged(ctx, k: int) -> None:
    """Every rank stops together, rank 0 naming the peers whose models hold NaN or inf."""
    rows = (~torch.isfinite(ctx.flat).all(1)).nonzero()[:, 0].tolist()  # one read of the device, not one a peer
    parts = ctx.transport.gather([ctx.peers[i] for i in rows])
    every = sorted(p for part in parts for p in part) if parts is not None else []
    shown = f"peers {every[:20]}{' ...' if len(every) > 20 else ''}" if every else "some peers"
    raise DivergenceError(f"round {k + 1}: {shown} have NaN/inf weights; lower --lr")
