"""What every algorithm gets (RunContext) and the one exchange most of them share (neighbour averaging)."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from p2pfl.comm import Message, Transport, Weights
from p2pfl.config import RunConfig
from p2pfl.data import Dataset
from p2pfl.errors import UserError
from p2pfl.faults import Faults
from p2pfl.models import PeerStack
from p2pfl.training import SGDSettings, StepTerms, train_epochs
from topologies import TopologySchedule, mixing_weights


@dataclass
class RunContext:
    cfg: RunConfig
    transport: Transport
    data: Dataset  # tensors on the run's device
    shards: list[torch.Tensor]  # every peer's training indices (all ranks know the partition)
    schedule: TopologySchedule
    stack: PeerStack
    peers: list[int]  # the peers this rank hosts
    flat: torch.Tensor  # (len(peers), D) their parameters
    device: torch.device
    global_weights: torch.Tensor | None = None  # a star's server model (rank 0); None: average all peers
    faults: Faults | None = None  # simulated faults, where any are asked for
    _on_device: tuple = field(default=(None, {}), repr=False)  # (the shards list, {peer: its indices there})

    def indices(self, peer: int) -> torch.Tensor:
        """peer's training indices on the run's device, copied there once (shards stay on the CPU, where
        minibatch plans are drawn from the keyed generators)."""
        shards, cache = self._on_device
        if shards is not self.shards:  # replaced (DataShare mixes the shared set in for a round)
            shards, cache = self.shards, {}
            self._on_device = (shards, cache)
        if peer not in cache:
            cache[peer] = self.shards[peer].to(self.device)
        return cache[peer]

    def samples(self, peer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """peer's training inputs and targets, on the run's device."""
        return self.rows(self.indices(peer))

    def rows(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The training inputs and targets at index (drawn on the CPU or held on the device)."""
        index = index.to(self.device)
        return self.data.train_x[index], self.data.train_y[index]

    def online_rows(self, round_index: int) -> list[int]:
        """Rows of this rank's peers that take part in the round (all of them without faults)."""
        if self.faults is None:
            return list(range(len(self.peers)))
        return [i for i, p in enumerate(self.peers) if not self.faults.offline(round_index, p)]

    def offline_rows(self, round_index: int) -> list[int]:
        """Rows of this rank's peers that are offline in the round (simulated faults)."""
        online = set(self.online_rows(round_index))
        return [i for i in range(len(self.peers)) if i not in online]

    @property
    def local_shards(self) -> list[torch.Tensor]:
        return [self.shards[p] for p in self.peers]

    @property
    def sample_counts(self) -> list[int]:
        return [len(s) for s in self.shards]

    def lr(self, round_index: int) -> float:
        """lr_k = lr * exp(-decay * k), the NTK-DFL reference code's schedule (decay 0: constant)."""
        return self.cfg.lr * math.exp(-self.cfg.lr_decay * round_index)

    def sgd(self) -> SGDSettings:
        c = self.cfg
        return SGDSettings(c.batch_size, c.local_epochs, c.momentum, c.weight_decay)


@dataclass(frozen=True)
class NoSettings:
    """An algorithm with no settings of its own."""


REGISTRY: dict[str, type["Algorithm"]] = {}  # every algorithm by name, filled as their classes are defined


class Algorithm:
    """One communication round at a time; an algorithm changes ctx.flat and returns per-peer train losses.

    A subclass declares what the registry, the CLI and the README derive from: its name, a one-line
    summary, its Settings dataclass (with setting_defaults overriding the class defaults), its defaults
    for the shared training flags, and whether it runs on a star around a server. A subclass that names
    itself is registered when it is defined: it needs no edit anywhere else (docs/design.md, "The
    Algorithm contract")."""

    name = ""
    summary = ""
    Settings: type = NoSettings
    setting_defaults: dict = {}
    training: dict = {}  # defaults of lr, lr_decay, batch_size, local_epochs, momentum
    centralized = False
    tasks = ("classification", "regression")  # what it can learn
    round_flags: tuple[str, ...] = ()  # flags whose values fix --rounds (see fixed_rounds)
    # What a checkpoint saves besides ctx.flat and ctx.global_weights (p2pfl.checkpoint), as attribute
    # names: tensors with one row per peer of this rank, the server's state (held on rank 0), and lists
    # whose order does not matter, pooled over ranks.
    peer_state: tuple[str, ...] = ()
    server_state: tuple[str, ...] = ()
    pooled_state: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("name"):
            register(cls)

    def __init__(self, ctx: RunContext):
        self.ctx = ctx
        self.settings = ctx.cfg.settings

    @classmethod
    def prepare_data(cls, data: Dataset, cfg: RunConfig) -> None:
        """Change the dataset before the model is built (NTK algorithms' input projection)."""

    @classmethod
    def fixed_rounds(cls, settings) -> int | None:
        """The run's number of rounds where the algorithm's own settings fix it (stages), else None."""
        return None

    @classmethod
    def default_rounds(cls, settings) -> int:
        """--rounds when none is given."""
        return 20

    @classmethod
    def check(cls, cfg: RunConfig) -> None:
        """Checks of the algorithm's settings against the rest of the run (UserError), before any work."""

    def notes(self) -> list[str]:
        """Facts of this run worth a line in the run header (config.toml comments and stderr)."""
        return []

    def round(self, round_index: int) -> torch.Tensor | None:
        raise NotImplementedError

    def row_fields(self, round_index: int) -> dict:
        """Extra fields of this round's metrics row, such as a stage (rank 0)."""
        return {}

    def gathered_fields(self, round_index: int) -> dict | None:
        """Called on every rank after each round (it may gather): extra fields of the metrics row, returned
        on rank 0 (NTK-DFL's histogram of the chosen t over all peers)."""
        return None

    def test_scores(self, x: torch.Tensor, y: torch.Tensor) -> tuple[dict, dict] | None:
        """Called on every rank at an evaluation: None to evaluate the networks as usual, or, on rank 0,
        (aggregated {metric: float}, clients {metric: (peers,)}) when the algorithm's model is another
        (TCT's linear model in stage 2); other ranks return ({}, {})."""
        return None

    def aggregate_model(self, weights: torch.Tensor) -> torch.Tensor | None:
        """The run's aggregated model from all peers' weights (P, D), on rank 0, where the algorithm
        defines its own (DisPFL's mask-wise average); None: the --aggregate average."""
        return None

    def resumable_after(self, rounds_done: int) -> bool:
        """Whether everything the next round depends on is in the declared state after this many rounds."""
        return True

    def finish(self, run_dir: Path | None) -> dict | None:
        """After the last round: extra results for the run folder (rank 0 writes them)."""
        return None


def check_round_result(algorithm: Algorithm, ctx: RunContext, k: int, losses, shape: tuple[int, ...]) -> None:
    """What an algorithm's round leaves, checked where it comes back (a user's algorithm, too): the
    weights keep their shape (one row of the model's parameters per peer of the rank), the losses are
    None or one per peer."""
    where = f"--algo {algorithm.name}: round {k + 1}"
    if not isinstance(ctx.flat, torch.Tensor) or tuple(ctx.flat.shape) != shape:
        got = tuple(ctx.flat.shape) if isinstance(ctx.flat, torch.Tensor) else type(ctx.flat).__name__
        raise UserError(f"{where} left ctx.flat as {got}; it must stay {shape} (a row of the model's "
                        f"{shape[1]:,} parameters for each of the rank's {shape[0]} peers)")
    if losses is not None and (not isinstance(losses, torch.Tensor) or tuple(losses.shape) != (shape[0],)):
        got = tuple(losses.shape) if isinstance(losses, torch.Tensor) else type(losses).__name__
        raise UserError(f"{where} returned losses {got}; a round returns None or one loss per peer ({shape[0]},)")


RUN_FIELDS = frozenset(f.name for f in dataclasses.fields(RunConfig))


def register(cls: type[Algorithm]) -> None:
    """Add an algorithm to the registry under its name; a second class of that name is refused (the same
    class defined again, by a reloaded module, replaces its first definition)."""
    known = REGISTRY.get(cls.name)
    where = f"algorithm {cls.name!r} ({cls.__module__}.{cls.__qualname__})"
    if known is not None and (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
        raise UserError(f"two algorithms are named {cls.name!r}: {known.__module__}.{known.__qualname__} and "
                        f"{cls.__module__}.{cls.__qualname__}; give one a name of its own")
    if not dataclasses.is_dataclass(cls.Settings) or not isinstance(cls.Settings, type):
        raise UserError(f"{where}: Settings must be a dataclass of p2pfl.option fields, not "
                        f"{type(cls.Settings).__name__} {cls.Settings!r}"[:300])
    core = sorted(f.name for f in dataclasses.fields(cls.Settings) if f.name in RUN_FIELDS)
    if core:
        raise UserError(f"{where}: its setting {core[0]!r} is named like the run's own --{core[0].replace('_', '-')}; "
                        "give it a name of its own")
    REGISTRY[cls.name] = cls


def train_taking_part(ctx: RunContext, round_index: int, flat: torch.Tensor, opt: SGDSettings,
                      terms: StepTerms | None = None) -> torch.Tensor:
    """Local epochs of SGD for this rank's peers that take part in the round (all of them without
    simulated faults), in place on flat (one row per peer of the rank); an offline peer keeps its
    weights and reports a NaN loss."""
    rows = ctx.online_rows(round_index)
    args = (ctx.data.train_x, ctx.data.train_y, opt, ctx.lr(round_index), ctx.cfg.seed, round_index)
    if len(rows) == len(ctx.peers):
        return train_epochs(ctx.stack, flat, ctx.local_shards, ctx.peers, *args, terms)
    losses = torch.full((len(ctx.peers),), math.nan, device=ctx.device)
    if rows:
        part = flat[rows]
        losses[rows] = train_epochs(ctx.stack, part, [ctx.local_shards[i] for i in rows],
                                    [ctx.peers[i] for i in rows], *args, terms.rows(rows) if terms else None)
        flat[rows] = part
    return losses


def neighbour_average(ctx: RunContext, round_index: int, flat: torch.Tensor, phase: str = "average") -> torch.Tensor:
    """Each peer sends its weights to its neighbours and takes the mixing-weighted average of its
    neighbourhood, synchronously: x_i <- sum_j W_ij x_j over j in N(i) + {i}, summed in peer order.
    Under simulated faults a peer averages what arrived, its weights renormalised to sum to 1 (an
    offline peer hears nothing and keeps its own weights)."""
    graph = ctx.schedule.graph(round_index)
    weights = mixing_weights(graph, ctx.cfg.mixing, ctx.sample_counts)
    row_of = {p: i for i, p in enumerate(ctx.peers)}
    messages = [Message(p, j, Weights(flat[row_of[p]])) for p in ctx.peers for j in graph.neighbors(p)]
    expect = [(j, p) for p in ctx.peers for j in graph.neighbors(p)]
    inbox = ctx.transport.exchange(phase, round_index, messages, expect, Weights)
    terms = []  # per row of this rank: (weight, the tensor it weighs), in peer order
    for p in ctx.peers:
        heard = [(j, w) for j, w in weights[p] if j == p or j in inbox[p]]
        if len(heard) < len(weights[p]):  # lost messages (simulated faults): the weights of what arrived
            total = sum(w for _, w in heard)
            heard = [(j, w / total) for j, w in heard]
        terms.append([(w, flat[row_of[p]] if j == p else inbox[p][j].weights) for j, w in heard])
    return mix_rows(terms, flat)


def mix_rows(terms: list[list[tuple[float, torch.Tensor]]], like: torch.Tensor,
             stacked: bool | None = None) -> torch.Tensor:
    """Row i = sum of w * x over terms[i], added in order from zero. On a GPU (stacked), the k-th terms
    of every row as one stacked product and sum: a few launches per neighbour instead of one per edge
    (3,600 a round at 300 peers). On the CPU edge by edge, which copies nothing (stacking the rows of a
    large model cost more than the launches it saves). The same arithmetic either way, so the same bits."""
    out = torch.zeros_like(like)
    if stacked is None:
        stacked = like.device.type != "cpu"
    if not stacked:
        for acc, row in zip(out, terms):
            for w, x in row:
                acc += w * x
        return out
    if not terms:
        return out
    zero = torch.zeros_like(like[0])
    for k in range(max(map(len, terms))):
        column = [row[k] if k < len(row) else (0.0, zero) for row in terms]
        w = torch.tensor([c[0] for c in column], dtype=like.dtype).to(like.device, non_blocking=True)
        out += w[:, None] * torch.stack([c[1] for c in column])
    return out
