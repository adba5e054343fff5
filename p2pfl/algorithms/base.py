"""The Algorithm contract, what a round returns (Round), and the one exchange most algorithms share
(neighbour averaging)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from p2pfl.algorithms.context import RunContext
from p2pfl.comm import Weights
from p2pfl.settings.run_config import RunConfig
from p2pfl.data import Dataset
from p2pfl.errors import UserError
from p2pfl.gossip.codecs import Compressed, GossipCodec, decode_checked, dense_bytes
from p2pfl.settings.fields import kind_of
from p2pfl.threats.privacy import PrivacyLedger
from topologies import in_neighbours, mixing_weights


@dataclass(frozen=True)
class NoSettings:
    """An algorithm with no settings of its own."""


REGISTRY: dict[str, type["Algorithm"]] = {}  # every algorithm by name, filled as their classes are defined


STATE_KINDS = ("peer", "server", "pooled")


@dataclass
class Round:
    """What a round reports; the loop builds the metrics row from it. The weights stay where the
    algorithm keeps them (ctx.flat, ctx.global_weights)."""

    losses: torch.Tensor | None = None  # one training loss per peer of the rank (NaN: it did not train); None: none
    fields: dict = field(default_factory=dict)  # extra fields of the row, such as a stage (rank 0's are written)
    pooled: dict[str, list] = field(default_factory=dict)  # lists joined over the ranks: the row holds each one's
    # histogram {value: count} (NTK-DFL's chosen t)
    scores: tuple[dict, dict] | None = None  # in an evaluated round (ctx.evaluates), where the algorithm's model
    # is not the network (TCT's linear model): on rank 0 (aggregated {metric: float}, clients {metric: (peers,)}),
    # ({}, {}) on the others; None: the networks are evaluated as usual
    resumable: bool = True  # whether the declared state holds all the next round needs (False: no checkpoint)
    seconds: float | None = None  # an asynchronous round's virtual seconds (its own clock); None: the clock's model


class Algorithm:
    """One communication round at a time: round(k) changes the weights it keeps (ctx.flat, a star's
    ctx.global_weights) and returns a Round of what it reports.

    A subclass declares what the registry, the CLI and the README derive from: its name, a one-line
    summary, its Settings dataclass (with setting_defaults overriding the class defaults), its defaults
    for the shared training flags, whether it runs on a star around a server, the tasks it learns, and
    the state a checkpoint saves. A subclass that names itself is registered when it is defined: it
    needs no edit anywhere else (docs/design.md, "The Algorithm contract")."""

    name = ""
    summary = ""
    Settings: type = NoSettings
    setting_defaults: dict = {}
    training: dict = {}  # defaults of lr, lr_decay, batch_size, local_epochs, momentum
    centralized = False
    directed_graphs = False  # whether its exchanges work on a directed graph, each peer hearing its in-neighbours
    static_graph = False  # whether it keeps state over a fixed set of neighbours (one graph for the whole run)
    withstands_threats = False  # whether its averaging takes Byzantine peers and robust rules (p2pfl.threats)
    mixing = "metropolis"  # its default --mixing on an undirected graph (a directed one takes uniform)
    push_sum = False  # whether it de-biases what it averages itself (push-sum), so that W need not keep the mean
    asynchronous = False  # whether its peers run on the event clock (a round is a span of virtual time)
    tasks = ("classification", "regression")  # what it can learn
    # What a checkpoint saves besides ctx.flat and ctx.global_weights (p2pfl.runner.checkpoint), by attribute name:
    # "peer", a tensor with one row per peer of the rank; "server", the server's (rank 0); "pooled", a list
    # whose order does not matter, pooled over ranks.
    state: dict[str, str] = {}
    products: tuple[str, ...] = ()  # the files its finish() writes into the run folder (--overwrite removes them)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("name"):
            register(cls)

    def __init__(self, ctx: RunContext, settings=None):
        self.ctx = ctx
        self.settings = ctx.cfg.settings if settings is None else settings

    @classmethod
    def prepare_data(cls, data: Dataset, cfg: RunConfig) -> None:
        """Change the dataset before the model is built (NTK algorithms' input projection)."""

    @classmethod
    def rounds(cls, settings, given: int | None) -> int:
        """The run's rounds from --rounds (None: not given); where the algorithm's own settings fix them
        (stages), a --rounds that disagrees is refused here (UserError)."""
        return 20 if given is None else given

    @classmethod
    def needs_static_graph(cls, settings) -> bool:
        """Whether a run with these settings keeps state over a fixed set of neighbours (static_graph; a
        gossip codec's public copies, for D-PSGD and DFedAvg)."""
        return cls.static_graph

    @classmethod
    def check(cls, cfg: RunConfig) -> None:
        """Checks of the algorithm's settings against the rest of the run (UserError), before any work."""

    def notes(self) -> list[str]:
        """Facts of this run worth a line in the run header (config.toml comments and stderr)."""
        return []

    private_training = False  # whether its gradients go through DP-SGD under --dp-clip (private_steps says how many)

    def work_steps(self, n_samples: int) -> int:
        """The local steps a peer of n samples takes in a round, which the virtual clock times (--step-time);
        1 by default: an algorithm's local work a round counts as one step."""
        return 1

    def private_steps(self, n_samples: int) -> int:
        """The DP-SGD steps a peer of n samples takes in a round (the privacy accountant composes them): its
        local steps."""
        return self.work_steps(n_samples)

    def privacy_ledger(self) -> PrivacyLedger | None:
        """What the run's DP-SGD spends (--dp-clip; None without): every peer's sampling rate batch / shard
        and its DP steps a round (private_steps), the honest peers the rows state."""
        ctx = self.ctx
        cfg = ctx.cfg
        if not cfg.dp_clip:
            return None
        if ctx.stack.couples_samples or ctx.stack.dropouts:
            raise UserError(
                f"--dp-clip needs each sample's own gradient; --model {cfg.model}'s batch norm or dropout couples or "
                "noises the samples of a batch: use --norm group, or a model without them"
            )
        sizes = [len(s) for s in ctx.shards]
        attackers = ctx.threats.attackers if ctx.threats is not None else frozenset()
        return PrivacyLedger(
            [min(1.0, cfg.batch_size / n) if n else 0.0 for n in sizes],
            [self.private_steps(n) if n else 0 for n in sizes],
            cfg.dp_noise,
            cfg.dp_delta,
            [p for p in range(cfg.peers) if p not in attackers],
            self.network_exposure(),
        )

    def network_exposure(self) -> np.ndarray | None:
        """S[u, v], how much of each DP step's noise of peer u peer v hears (p2pfl.threats.privacy.exposure),
        for pairwise network DP; None (the default): not counted."""
        return None

    def round(self, round_index: int) -> Round:
        """Round round_index (from 0): change the weights in place and return what the round reports."""
        raise NotImplementedError

    def aggregate_coefficients(self, flat: torch.Tensor) -> torch.Tensor | None:
        """Where the run's aggregated model is the algorithm's own weighting of the peers' weights: this
        rank's rows' coefficients a_i, a number (L,) or one per coordinate (L, D), of the average
        sum_i a_i w_i / sum_i a_i taken over every peer (DisPFL's mask-wise average); None: --aggregate's."""
        return None

    def finish(self, run_dir: Path | None) -> dict | None:
        """After the last round: extra results for the run folder (rank 0 writes them)."""
        return None


def refuse_momentum(cls: type[Algorithm], cfg: RunConfig) -> None:
    """For an optimizer whose paper's step has no local momentum (gradient tracking, D², SGP): --momentum
    would be silently ignored, so it is refused in one line."""
    if cfg.momentum:
        raise UserError(
            f"--algo {cls.name} steps without momentum (its paper's update); drop --momentum {cfg.momentum:g}, "
            "or use --algo qg-dsgdm or --algo dpsgd --momentum for a momentum baseline"
        )


def check_round_result(
    algorithm: Algorithm, ctx: RunContext, k: int, result, shape: tuple[int, ...], dtype: torch.dtype = torch.float32
) -> Round:
    """What an algorithm's round returns and leaves, checked where it comes back (a user's algorithm, too):
    a Round, the weights keep their shape (one row of the model's parameters per peer of the rank), the
    losses are None or one per peer."""
    where = f"--algo {algorithm.name}: round {k + 1}"
    if isinstance(ctx.flat, torch.Tensor) and ctx.flat.dtype != dtype:
        raise UserError(
            f"{where} left ctx.flat as {str(ctx.flat.dtype).replace('torch.', '')}; it must stay "
            f"{str(dtype).replace('torch.', '')}, as the model's parameters"
        )
    if not isinstance(ctx.flat, torch.Tensor) or tuple(ctx.flat.shape) != shape:
        got = tuple(ctx.flat.shape) if isinstance(ctx.flat, torch.Tensor) else type(ctx.flat).__name__
        raise UserError(
            f"{where} left ctx.flat as {got}; it must stay {shape} (a row of the model's "
            f"{shape[1]:,} parameters for each of the rank's {shape[0]} peers)"
        )
    if not isinstance(result, Round):
        raise UserError(f"{where} returned {type(result).__name__}; a round returns p2pfl.Round(losses, ...)")
    losses = result.losses
    if losses is not None and (not isinstance(losses, torch.Tensor) or tuple(losses.shape) != (shape[0],)):
        got = tuple(losses.shape) if isinstance(losses, torch.Tensor) else type(losses).__name__
        raise UserError(f"{where} returned losses {got}; Round.losses is None or one loss per peer ({shape[0]},)")
    return result


RUN_FIELDS = frozenset(f.name for f in dataclasses.fields(RunConfig))


def register(cls: type[Algorithm]) -> None:
    """Add an algorithm to the registry under its name; a second class of that name is refused (the same
    class defined again, by a reloaded module, replaces its first definition)."""
    known = REGISTRY.get(cls.name)
    where = f"algorithm {cls.name!r} ({cls.__module__}.{cls.__qualname__})"
    if known is not None and (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
        raise UserError(
            f"two algorithms are named {cls.name!r}: {known.__module__}.{known.__qualname__} and "
            f"{cls.__module__}.{cls.__qualname__}; give one a name of its own"
        )
    if not dataclasses.is_dataclass(cls.Settings) or not isinstance(cls.Settings, type):
        raise UserError(
            f"{where}: Settings must be a dataclass of p2pfl.option fields, not "
            f"{type(cls.Settings).__name__} {cls.Settings!r}"[:300]
        )
    core = sorted(f.name for f in dataclasses.fields(cls.Settings) if f.name in RUN_FIELDS)
    if core:
        raise UserError(
            f"{where}: its setting {core[0]!r} is named like the run's own --{core[0].replace('_', '-')}; "
            "give it a name of its own"
        )
    for f in dataclasses.fields(cls.Settings):
        try:
            kind_of(f)
        except TypeError:
            raise UserError(
                f"{where}: its setting {f.name!r} is of type {getattr(f.type, '__name__', f.type)}; settings are "
                "bool, int, float, str or a list of ints"
            ) from None
    kinds = cls.state if isinstance(cls.state, dict) else {}
    wrong = [f"{name}: {kind!r}" for name, kind in kinds.items() if kind not in STATE_KINDS]
    if not isinstance(cls.state, (dict, property)) or wrong:
        raise UserError(
            f"{where}: state maps attribute names to one of {', '.join(STATE_KINDS)}; got "
            f"{(wrong[0] if wrong else repr(cls.state))}"[:300]
        )
    if cls.round is Algorithm.round:
        raise UserError(f"{where} has no round(self, round_index); an algorithm is its round")
    REGISTRY[cls.name] = cls


def neighbour_average(
    ctx: RunContext,
    round_index: int,
    flat: torch.Tensor,
    phase: str = "average",
    codec: GossipCodec | None = None,
    weights: dict[int, list[tuple[int, float]]] | None = None,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Each peer sends its weights to its neighbours and takes the mixing-weighted average of its
    neighbourhood, synchronously: x_i <- sum_j W_ij x_j over j in N(i) + {i}, summed in peer order.
    Under simulated faults a peer averages what arrived, its weights renormalised to sum to 1 (an
    offline peer hears nothing and keeps its own weights). With a codec, each peer sends its row encoded
    and averages what it decodes (its own values where a sparse message left a coordinate out). weights: the
    round's W as topologies.mixing_weights gives it (None: --mixing's). dtype: the sums' (None: flat's), e.g.
    float64 sums of float32 messages."""
    if weights is None:
        weights = mixing_weights(ctx.schedule.graph(round_index), ctx.cfg.mixing, ctx.sample_counts)
    row = ctx.row
    if codec is None:
        sends = {p: Weights(flat[row[p]]) for p in ctx.peers}
        inbox = ctx.neighbour_exchange(phase, round_index, Weights, sends)
    else:
        messages = codec.encode_rows(flat, ctx.cfg.seed, round_index, ctx.peers)
        sends = {p: (message, dense_bytes(flat[0])) for p, message in zip(ctx.peers, messages)}
        inbox = ctx.neighbour_exchange(phase, round_index, Compressed, sends)
    terms = []  # per row of this rank: (weight, the tensor it weighs), in peer order
    senders = []  # per row: the peers those terms came from
    decoded: dict[int, tuple] = {}  # each sender's message decoded once, however many of its receivers are here
    for p in ctx.peers:
        heard = [(j, w) for j, w in weights[p] if j == p or j in inbox[p]]
        if len(heard) < len(weights[p]):  # lost messages (simulated faults): the weights of what arrived
            total = sum(w for _, w in heard)
            heard = [(j, w / total) for j, w in heard]
        own = flat[row[p]]
        terms.append([(w, own if j == p else _heard(codec, inbox[p][j], own, decoded, j)) for j, w in heard])
        senders.append([j for j, _ in heard])
    like = flat if dtype is None else flat.to(dtype)
    if ctx.threats is not None and codec is None:  # Byzantine messages and a robust rule, peer by peer
        graph = ctx.schedule.graph(round_index)
        bound = ctx.threats.round_bound(lambda p: in_neighbours(graph, p))
        rows = [
            ctx.threats.average(
                round_index, p, like[row[p]], [(j, w, x.to(like.dtype)) for j, (w, x) in zip(js, ts)], bound
            )
            for p, js, ts in zip(ctx.peers, senders, terms)
        ]
        return torch.stack(rows)
    return mix_rows(terms, like)


def _heard(codec: GossipCodec | None, message, own: torch.Tensor, decoded: dict, sender: int) -> torch.Tensor:
    """A neighbour's row as its message gives it: dense, or its sparse coordinates over the receiver's own."""
    if codec is None:
        return message.weights
    if sender not in decoded:
        decoded[sender] = decode_checked(codec, message, own.numel())
    index, values = decoded[sender]
    if index is None:
        return values
    row = own.clone()
    row[index] = values
    return row


MIX_BLOCK_BYTES = 512 * 2**20  # a stacked mixing step's temporaries at most (a column's stack and its product)


def mix_rows(
    terms: list[list[tuple[float, torch.Tensor]]], like: torch.Tensor, stacked: bool | None = None
) -> torch.Tensor:
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
                acc += w * (x if x.dtype == acc.dtype else x.to(acc.dtype))  # the product in the sum's precision
        return out
    if not terms:
        return out
    zero = torch.zeros_like(like[0])
    block = max(1, MIX_BLOCK_BYTES // (2 * like[0].numel() * like.element_size()))  # rows whose terms are stacked
    for start in range(0, len(terms), block):  # at once: large models' stacks within MIX_BLOCK_BYTES
        rows = terms[start : start + block]
        for k in range(max(map(len, rows))):
            column = [row[k] if k < len(row) else (0.0, zero) for row in rows]
            w = torch.tensor([c[0] for c in column], dtype=like.dtype).to(like.device, non_blocking=True)
            out[start : start + block] += w[:, None] * torch.stack([c[1] for c in column]).to(like.dtype)
    return out
