"""Asynchronous gossip on an event-driven virtual clock: each peer works at its own speed (p2pfl.comm.clock's
step times), and what it does when its work is done (AD-PSGD's atomic averaging with a neighbour, gossip
learning's push of its model) happens at that virtual moment, in time order.

A peer's work starts from a snapshot of its weights; the change its local training makes to the snapshot is
added to its weights, whatever they have become since, when the work is done: a stale change, as on real
machines. Events run in virtual-time order (at one instant: arrivals, then finished work, then starts, each
by peer). A change is computed only when an event needs it, and then every pending one at once, as one
batch of the run's batched model: the clock decides the order, not a Python loop over events.

The same on any layout: every rank replays every event on its own copy of every peer's weights (two n x D
copies a rank, the price of a replay that needs no message per event); each rank trains its own peers'
pending changes and the ranks share them. Order, partners and minibatches come from the seed (keyed by peer
and its step count), so one process equals mpirun -n 3 to the bit. Every pending change is computed before
a row ends, so the row's state (weights, changes, clocks, models in flight) is all a resume needs.

A round (a row) is --round-time virtual seconds, so rows, evaluation, checkpoints and stops work as for a
synchronous run.
"""

from __future__ import annotations

import heapq
import math
import statistics
from dataclasses import dataclass

import torch

from p2pfl.algorithms.base import Algorithm, Round
from p2pfl.comm import Message, Weights
from p2pfl.errors import UserError
from p2pfl.local.training import SGDSettings, local_steps
from p2pfl.seeding import uniform_draw
from p2pfl.settings.fields import option, positive

ARRIVAL, DONE, START = 0, 1, 2  # event kinds, in the order they run at one instant


@dataclass(frozen=True)
class AsyncSettings:
    round_time: float | None = option(
        None,
        "the virtual seconds one row of an asynchronous run covers (its round)",
        positive,
        shown="the median peer's time for its local work (1 s without --step-time)",
    )


class AsyncGossip(Algorithm):
    """What AD-PSGD and gossip learning share: the event clock, the snapshots and their batched training, the
    replicated weights. A subclass says what a peer does when its work is done (finished) and, where models
    travel, when one arrives (arrive)."""

    Settings = AsyncSettings
    asynchronous = True
    mixing = "uniform"  # not used: a pair averages, a merge halves (a run's config.toml names this)
    state = {"change": "peer", "timing": "peer"}

    @classmethod
    def check(cls, cfg) -> None:
        if cfg.mixing not in (None, "uniform"):
            raise UserError(f"--algo {cls.name} averages pairs equally; drop --mixing {cfg.mixing}")
        faults = [f"--{n.replace('_', '-')}" for n in ("drop_peers", "slow_peers") if getattr(cfg, n) > 0]
        if faults:
            raise UserError(
                f"--algo {cls.name} is asynchronous: {faults[0]} acts on synchronous rounds; slow peers are "
                "--slower-peers or --step-time-spread here, every peer's time its own (--drop-links works)"
            )

    def local_sgd(self) -> SGDSettings:
        """A peer's local work: the run's local SGD (a subclass narrows it)."""
        return self.ctx.sgd()

    def work_steps(self, n_samples: int) -> int:
        return local_steps(n_samples, self.local_sgd())

    def __init__(self, ctx, settings=None):
        super().__init__(ctx, settings)
        n = ctx.cfg.peers
        self.duration = [  # a peer without samples never finishes a work
            ctx.network.work(p, self.work_steps(len(s))) if len(s) else math.inf for p, s in enumerate(ctx.shards)
        ]
        finite = [d for d in self.duration if math.isfinite(d)]
        self.period = self.settings.round_time or statistics.median(finite or [1.0])
        self.change = torch.zeros_like(ctx.flat)  # each peer's change from its work under way (computed)
        # each peer's next event: [its virtual time, DONE or START, the works it started, when the work under way
        # began]; NaN: not begun
        self.timing = torch.full((len(ctx.peers), 4), math.nan, dtype=torch.float64, device=ctx.device)
        self.away = ctx.faults.availability if ctx.faults is not None else None  # churn, asked at each event
        self.in_flight: list = []  # models on their way: (arrival, dst, src, weights), saved by dst's rank
        self.started: list[int] | None = None  # each peer's works begun; None until the first round builds the
        # replica from the state above (a resume's, too)
        self.n = n

    def notes(self) -> list[str]:
        return [
            f"asynchronous: a round is {self.period:.4g} virtual seconds (--round-time), events in virtual-time order"
        ]

    # -- what a subclass writes ------------------------------------------------------------------------
    def finished(self, round_index: int, t: float, peer: int) -> float:
        """peer's work is done at t: use self.x and self.changes; return when its next work starts (>= t)."""
        raise NotImplementedError

    def arrive(self, t: float, dst: int, src: int, weights: torch.Tensor) -> None:
        """A model src pushed reaches dst at t."""

    # -- the clock ---------------------------------------------------------------------------------------
    def round(self, round_index: int) -> Round:
        if self.started is None:
            self._build()
        ctx = self.ctx
        self.loss_sum = torch.zeros(len(ctx.peers), dtype=torch.float64, device=ctx.device)
        self.loss_count = torch.zeros(len(ctx.peers), device=ctx.device)
        horizon = (round_index + 1) * self.period
        events = self.events
        while events and events[0][0] <= horizon:
            t, kind, peer, src = heapq.heappop(events)
            if kind == ARRIVAL:
                self.arrive(t, peer, src, self.mail.pop((t, peer, src)))
            elif kind == DONE:
                if self.away is not None and self.away.away_within(peer, self.began[peer], t):
                    start = self.away.back_at(peer, t)  # away during its work: the work is lost
                else:
                    if peer in self.pending:
                        self._train_pending(round_index)
                    start = self.finished(round_index, t, peer)
                if start > t:
                    self._schedule(start, START, peer)
                else:
                    self._start(start, peer)
            else:
                self._start(t, peer)
        self._train_pending(round_index)
        self._keep_state()
        losses = (self.loss_sum / self.loss_count).to(torch.float32)  # NaN where no work was done in the round
        return Round(losses, seconds=self.period)

    def _schedule(self, t: float, kind: int, peer: int) -> None:
        """peer's next event (a work done, or a start); one at t = inf never comes."""
        self.next_event[peer] = (t, kind)
        if math.isfinite(t):
            heapq.heappush(self.events, (t, kind, peer, -1))

    def _start(self, t: float, peer: int) -> None:
        """peer begins a work at t from its weights now (away at t: it waits to return)."""
        back = self.away.back_at(peer, t) if self.away is not None else t
        if back > t:
            self._schedule(back, START, peer)
            return
        self.began[peer] = t
        self.pending.add(peer)
        if peer in self.ctx.row:
            self.snapshot[self.ctx.row[peer]] = self.x[peer]
        self.key[peer] = self.started[peer]
        self.started[peer] += 1
        self._schedule(t + self.duration[peer], DONE, peer)

    def _train_pending(self, round_index: int) -> None:
        """Every pending work's change at once: this rank's peers trained as one batch from their snapshots,
        the changes shared with the other ranks."""
        if not self.pending:
            return
        ctx = self.ctx
        mine = [p for p in sorted(self.pending) if p in ctx.row]
        shared = None
        if mine:
            rows = [ctx.row[p] for p in mine]
            part = self.snapshot[rows].clone()
            losses = ctx.train([self.key[p] for p in mine], part, mine, self.local_sgd(), lr=ctx.lr(round_index))
            self.loss_sum[rows] += losses.double()
            self.loss_count[rows] += 1
            shared = (mine, part - self.snapshot[rows])
        for got in self._everyone(shared):
            if got is not None:
                self.changes[got[0]] = got[1]
        self.pending.clear()

    def _everyone(self, obj) -> list:
        """obj from every rank, on every rank (itself alone on one rank): (peers, rows) or a list of models in
        flight, their tensors crossing on the CPU and handed back on the run's device."""
        transport = self.ctx.transport
        got = [obj] if transport.size == 1 else transport.bcast(transport.gather(_moved(obj, "cpu")))
        return [_moved(part, self.ctx.device) for part in got]

    # -- the replica and the state a checkpoint saves ---------------------------------------------------
    def _build(self) -> None:
        """Every peer's weights, change and next event on every rank, from this rank's (a resume's) state."""
        ctx = self.ctx
        parts = self._everyone((list(ctx.peers), torch.cat([ctx.flat, self.change], 1)))
        width = ctx.flat.shape[1]
        both = torch.empty(self.n, 2 * width, dtype=ctx.flat.dtype, device=ctx.device)
        for peers, rows in parts:
            both[peers] = rows
        self.x, self.changes = both[:, :width].contiguous(), both[:, width:].contiguous()
        timing = torch.empty(self.n, 4, dtype=torch.float64, device=ctx.device)
        for peers, rows in self._everyone((list(ctx.peers), self.timing)):
            timing[peers] = rows
        timing = timing.tolist()
        self.snapshot = torch.empty_like(ctx.flat)
        self.pending: set[int] = set()
        self.events: list = []
        self.next_event: dict[int, tuple[float, int]] = {}
        self.started = [0 if math.isnan(row[2]) else int(row[2]) for row in timing]
        self.key = [max(s - 1, 0) for s in self.started]
        self.began = [row[3] for row in timing]
        for p, (t, kind, _, _) in enumerate(timing):
            if math.isnan(t):  # not begun: every peer starts its first work at 0
                self._start(0.0, p)
            else:
                self._schedule(t, int(kind), p)
        self.mail = {}
        for part in self._everyone(self.in_flight):  # a resume's, all on rank 0
            for arrival, dst, src, weights in part:
                self.mail[(arrival, dst, src)] = weights
                heapq.heappush(self.events, (arrival, ARRIVAL, dst, src))

    def _keep_state(self) -> None:
        """This rank's part of the replica as the checkpointed state: weights (ctx.flat), changes, next
        events, and the models in flight to its peers."""
        ctx = self.ctx
        own = list(ctx.peers)
        ctx.flat = self.x[own].clone()
        self.change = self.changes[own].clone()
        self.timing = torch.tensor(
            [[*self.next_event[p], self.started[p], self.began[p]] for p in own], dtype=torch.float64, device=ctx.device
        ).reshape(len(own), 4)
        self.in_flight = [(t, dst, src, w.cpu()) for (t, dst, src), w in self.mail.items() if dst in ctx.row]

    # -- what subclasses share -----------------------------------------------------------------------------
    def partner(self, round_index: int, peer: int) -> int | None:
        """The neighbour peer exchanges with after its current work: one of the round's graph's, drawn from
        the seed by peer and its step count (None: it has none)."""
        graph = self.ctx.schedule.graph(round_index)
        neighbours = sorted(graph.neighbors(peer))  # a digraph's neighbours are its successors
        if not neighbours:
            return None
        draw = uniform_draw(self.ctx.cfg.seed, "async-partner", peer, self.key[peer])
        return neighbours[min(int(draw * len(neighbours)), len(neighbours) - 1)]

    def message_time(self, round_index: int, src: int, dst: int) -> float:
        """One model's virtual seconds from src to dst: the link's latency and bandwidth (p2pfl.comm.clock)."""
        graph = self.ctx.schedule.graph(round_index)
        edge = graph.get_edge_data(src, dst) if graph.has_edge(src, dst) else None
        return self.ctx.network.message_time(src, dst, self.x[src].numel() * self.x.element_size(), edge)

    def send(self, src: int, dst: int, arrival: float) -> bool:
        """src's model sent to dst, counted by src's rank as the transport counts a message; whether it
        arrives: --drop-links loses it with its probability (drawn by src, dst and src's step count), and a
        peer away at the arrival (churn) hears nothing."""
        faults, counter = self.ctx.faults, self.ctx.transport.counter
        lost = faults is not None and uniform_draw(faults.seed, "drop-link/async", self.key[src], src, dst) < (
            faults.drop_links
        )
        arrives = not lost and (self.away is None or self.away.present(dst, arrival))
        if src in self.ctx.row:
            counter.record("gossip", [Message(src, dst, Weights(self.x[src]))])
            counter.lost += not arrives
        return arrives


def _moved(obj, device):
    """obj with its tensors on device: (peers, rows), a list of models in flight, or None."""
    if isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[1], torch.Tensor):
        return obj[0], obj[1].to(device)
    if isinstance(obj, list):
        return [(t, dst, src, w.to(device)) for t, dst, src, w in obj]
    return obj
