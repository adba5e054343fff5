"""What algorithms talk to: point-to-point messages between peers, grouped in phases.

Algorithms never see MPI. A phase hands the transport the (src peer, dst peer, tensors) messages of
this rank's peers and the (src, dst) pairs it expects to receive, and gets back what arrived. Every
message is counted in bytes (what was sent, and its dense equivalent where a codec compressed it).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch


class Payload:
    """What a message carries: a dataclass whose fields are tensors, the last one may be a tuple of tensors
    (a Jacobian's parts). On the wire it is the flat tuple of its tensors, and the receiving phase names
    the class to rebuild it with."""

    def tensors(self) -> tuple[torch.Tensor, ...]:
        out: list[torch.Tensor] = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out.extend(value if isinstance(value, tuple) else (value,))
        return tuple(out)

    @classmethod
    def from_tensors(cls, tensors: Sequence[torch.Tensor]):
        fields = dataclasses.fields(cls)
        names = [f.name for f in fields]
        variadic = str(fields[-1].type).startswith("tuple")
        fixed = names[:-1] if variadic else names
        values = dict(zip(fixed, tensors))
        if variadic:
            values[names[-1]] = tuple(tensors[len(fixed) :])
        return cls(**values)

    def to(self, device) -> "Payload":
        return type(self).from_tensors([t.to(device) for t in self.tensors()])


@dataclass
class Tensors(Payload):
    """Any tensors, positionally: the transport's own tests and tools, not algorithms."""

    items: tuple[torch.Tensor, ...]


@dataclass
class Weights(Payload):
    """A model's flat weights (and state buffers): averaging, downloads, FedAvg-style uploads."""

    weights: torch.Tensor


Inbox = dict[int, dict[int, Payload]]  # inbox[dst][src] = payload


@dataclass
class Message:
    """One payload from peer src to peer dst; the transport counts its bytes (and dense_nbytes, what it
    would weigh uncompressed, for the compression ratios)."""

    src: int  # the sending peer
    dst: int  # the receiving peer
    payload: Payload  # what it carries
    dense_nbytes: int | None = None  # what the payload would weigh uncompressed

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.payload.tensors()

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)


class Placement:
    """Nodes on ranks in contiguous blocks; extra nodes (a star's server) live on rank 0."""

    def __init__(self, peers: int, ranks: int, extra_on_root: int = 0):
        if peers < ranks:
            raise ValueError(f"{peers} peers cannot fill {ranks} ranks")
        self.peers, self.ranks = peers, ranks
        base, rest = divmod(peers, ranks)
        self.starts = [r * base + min(r, rest) for r in range(ranks + 1)]
        self.extra = list(range(peers, peers + extra_on_root))

    def rank_of(self, node: int) -> int:
        if node >= self.peers:
            return 0
        lo, hi = 0, self.ranks
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.starts[mid] <= node:
                lo = mid
            else:
                hi = mid
        return lo

    def peers_of(self, rank: int) -> list[int]:
        return list(range(self.starts[rank], self.starts[rank + 1]))

    def nodes_of(self, rank: int) -> list[int]:
        return self.peers_of(rank) + (self.extra if rank == 0 else [])

    def counts(self) -> list[int]:
        return [self.starts[r + 1] - self.starts[r] for r in range(self.ranks)]


class ByteCounter:
    """Bytes this rank's peers sent, per phase, since the last take(); messages lost (simulated); bytes
    per link {(lower peer, higher peer): both directions} since the last take_links(); and the messages
    that arrived, exchange by exchange in the order they ran, since the last take_exchanges() (every rank
    makes the same exchanges, so the ranks' lists line up)."""

    def __init__(self):
        self.sent: dict[str, int] = defaultdict(int)
        self.dense: dict[str, int] = defaultdict(int)
        self.lost = 0
        self.links: dict[tuple[int, int], int] = defaultdict(int)
        self.exchanges: list[list[tuple[int, int, int]]] = []  # each exchange's (src, dst, bytes) that arrived

    def take_exchanges(self) -> list[list[tuple[int, int, int]]]:
        exchanges, self.exchanges = self.exchanges, []
        return exchanges

    def record(self, phase: str, messages: Iterable[Message]) -> None:
        for m in messages:
            size = m.nbytes
            self.sent[phase] += size
            self.dense[phase] += size if m.dense_nbytes is None else m.dense_nbytes
            self.links[(min(m.src, m.dst), max(m.src, m.dst))] += size

    def take_links(self) -> dict[tuple[int, int], int]:
        links = dict(self.links)
        self.links.clear()
        return links

    def take(self) -> tuple[dict[str, int], dict[str, int], int]:
        sent, dense, lost = dict(self.sent), dict(self.dense), self.lost
        self.sent.clear()
        self.dense.clear()
        self.lost = 0
        return sent, dense, lost


class CommTimeout(RuntimeError):
    """A peer's message did not come within --comm-timeout (a rank died or stalls). `reporter` is the rank
    that prints it: the lowest rank not among the missing ones; other ranks that give up hand it their
    message (notify), so that one line is printed."""

    def __init__(self, message: str, reporter: int = 0):
        super().__init__(message)
        self.reporter = reporter
        self.notify = None  # MPI: hands the message to the reporter and waits for it to end the job


class Transport:
    rank = 0
    size = 1
    round_index = 0  # the round under way (0-based), for messages about it
    faults = None  # p2pfl.comm.faults.Faults: simulated offline peers, lost and late messages
    device = torch.device("cpu")  # where received payloads are handed over: the run's device

    def __init__(self, placement: Placement, timeout: float = 600.0):
        self.placement = placement
        self.timeout = timeout
        self.counter = ByteCounter()
        self.local_nodes = set(placement.nodes_of(self.rank))

    def exchange(
        self,
        phase: str,
        round_index: int,
        messages: Sequence[Message],
        expect: Iterable[tuple[int, int]],
        kind: type[Payload] = Tensors,
        reliable: bool = False,
    ) -> Inbox:
        """Send messages from this rank's peers; return what this rank's peers receive, as payloads of
        class kind (what the phase carries).

        expect lists the (src, dst) pairs with dst on this rank; the call returns when all arrived.
        Simulated faults drop messages (and the matching expectations) unless the phase is reliable."""
        for m in messages:
            if m.src not in self.local_nodes:
                raise ValueError(f"peer {m.src} is not on rank {self.rank}")
        if self.faults is not None and not reliable:  # offline peers send nothing; lost and late ones never arrive
            messages = [m for m in messages if self.faults.sends(round_index, m.src)]
            self.counter.record(phase, messages)
            arriving = [m for m in messages if self.delivered(round_index, m.src, m.dst, phase)]
            self.counter.lost += len(messages) - len(arriving)
            messages = arriving
            expect = [(s, d) for s, d in expect if self.delivered(round_index, s, d, phase)]
        else:
            self.counter.record(phase, messages)
        self.counter.exchanges.append([(m.src, m.dst, m.nbytes) for m in messages])  # the virtual clock's
        inbox: Inbox = defaultdict(dict)
        remote: list[Message] = []
        for m in messages:
            if m.dst in self.local_nodes:
                inbox[m.dst][m.src] = m.payload
            else:
                remote.append(m)
        pending = {(s, d) for s, d in expect if d in self.local_nodes and s not in self.local_nodes}
        if remote or pending:
            self._remote_exchange(phase, round_index, remote, pending, inbox, kind)
        missing = [(s, d) for s, d in expect if d in self.local_nodes and s not in inbox.get(d, {})]
        if missing:
            raise CommTimeout(f"round {round_index + 1}, {phase}: no message for {missing[:10]}", self.rank)
        return inbox

    def delivered(self, round_index: int, src: int, dst: int, phase: str) -> bool:
        """Whether src's message to dst in this round's phase arrives (always, without simulated faults)."""
        return self.faults is None or self.faults.delivered(round_index, src, dst, phase)

    def _remote_exchange(self, phase, round_index, remote, pending, inbox, kind) -> None:
        raise RuntimeError("this transport has a single rank; peers on other ranks cannot exist")

    # Bookkeeping collectives: simulation plumbing (metrics), not simulated traffic, so not counted.
    def gather_rows(self, rows: torch.Tensor) -> torch.Tensor | None:
        """Rows of this rank's peers -> every peer's row in peer order, on rank 0 (None elsewhere)."""
        return rows

    def gather(self, obj) -> list | None:
        return [obj]

    def bcast(self, obj):
        return obj

    def reduce(self, values: torch.Tensor) -> torch.Tensor | None:
        """The sum over ranks of each rank's float64 values, on rank 0 (None elsewhere): what a sum over
        every peer says without any rank holding every peer's values (a tree over the ranks under MPI)."""
        return values

    def allreduce(self, values: torch.Tensor) -> torch.Tensor:
        """The sum over ranks of each rank's float64 values, on every rank."""
        return values

    def agree(self, flag: bool, rank0_value):
        """(flag on any rank, rank 0's value) on every rank: one decision for all ranks."""
        return flag, rank0_value

    def barrier(self) -> None:
        pass

    @contextmanager
    def emergency(self):
        """The collectives inside it apart from any that a signal cut short (under MPI: on their own tag),
        for saving on the way out of a stopped run."""
        yield

    # A stop by signal on one rank (a node preempted) reaches the others: each rank watches for it.
    def announce_stop(self, why: str) -> None:
        """Tell every other rank that this one stops at once, and why."""

    def watch_for_stops(self, on_stop) -> None:
        """on_stop(why) (from another thread) when another rank announces a stop."""

    def stop_watching(self) -> None:
        pass


class LocalTransport(Transport):
    """In-process transport: every peer lives in this process, messages are handed over in memory (the
    base class's single-rank behaviour, on one rank)."""

    def __init__(self, peers: int, extra_on_root: int = 0, timeout: float = 600.0):
        super().__init__(Placement(peers, 1, extra_on_root), timeout)
