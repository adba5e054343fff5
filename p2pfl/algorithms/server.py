"""Centralized algorithms as a star: the hub is the server (node `peers`, on rank 0), the leaves are
the clients. Each round the server samples --clients-per-round clients (seeded by round), sends them
what they need ('download'), they work locally and send back ('upload'), and the server updates the
global model. Both directions go through the transport, so every byte is counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from p2pfl.algorithms.base import Algorithm, RunContext, Round
from p2pfl.settings.fields import non_negative, option
from p2pfl.comm import Message, Payload, Weights
from p2pfl.models import initial_parameters


@dataclass(frozen=True)
class ClientWork:
    """What one client's local work returns: its upload (and the bytes it would take uncompressed, where
    it is compressed), its model after the work, which the base writes into the client's row (None: the
    row keeps what it holds), and its training loss (None: it did not train)."""

    upload: Payload
    model: torch.Tensor | None = None
    loss: torch.Tensor | float | None = None
    dense: int | None = None


@dataclass(frozen=True)
class StarExchange:
    """What a server -> clients -> server exchange returns: the uploads that reached the server
    ({client: payload} on its rank, {} elsewhere) and this rank's peers' training losses (NaN: a peer
    that did not train in it)."""

    uploads: dict[int, Payload]
    losses: torch.Tensor


@dataclass(frozen=True)
class ServerOptions:
    """A star algorithm's settings: subclass it for your own (how many clients a round samples)."""

    clients_per_round: int = option(20, "clients the server samples each round (at most --peers; 0: all)", non_negative)


def clients_per_round(settings, peers: int) -> int:
    """How many clients the server samples a round: --clients-per-round, all of them where it is 0 or
    the algorithm has no such setting."""
    return (settings.clients_per_round if isinstance(settings, ServerOptions) else 0) or peers


class ServerAlgorithm(Algorithm):
    """A star: the server (node --peers) samples clients each round, each trains from the server's model,
    and the server aggregates what they upload. Write client_work (a client's upload) and aggregate
    (the server's step); star_round runs the exchange and reports the bytes and losses."""

    centralized = True
    trains_locally = True  # clients run SGD, so a round reports their training losses
    Download: type[Payload] = Weights  # what the server sends a sampled client
    Upload: type[Payload] = Weights  # what a client sends back

    def __init__(self, ctx: RunContext, settings=None):
        super().__init__(ctx, settings)
        self.server = ctx.cfg.peers
        self.is_server = self.server in ctx.transport.local_nodes
        self.per_round = clients_per_round(self.settings, ctx.cfg.peers)
        if self.is_server and ctx.global_weights is None:  # an algorithm held by another shares its model
            ctx.global_weights = initial_parameters(ctx.stack.model, [self.server], ctx.cfg.seed, "same", ctx.device)[0]

    def sample(self, round_index: int) -> list[int]:
        rng = self.ctx.rng("clients", round_index)
        return sorted(rng.choice(self.ctx.cfg.peers, self.per_round, replace=False).tolist())

    def round(self, round_index: int) -> Round:
        """Sample the round's clients, download the server's model, run client_work on each, and
        aggregate the uploads into the server's model."""
        ctx, clients = self.ctx, self.sample(round_index)
        done = self.star_round(
            round_index,
            clients,
            download=lambda c: self.download(round_index, c),
            work=lambda mine, received: self.client_work(round_index, mine, received),
            kinds=(self.Download, self.Upload),
        )
        heard = [c for c in clients if c in done.uploads]  # every sampled client, unless faults lost some
        if self.is_server and heard:
            ctx.global_weights = self.server_update(round_index, heard, done.uploads)
        return Round(done.losses if self.trains_locally else None)

    def star_round(
        self,
        round_index: int,
        clients: list[int],
        *,
        download,
        work,
        kinds: tuple[type[Payload], type[Payload]] = (Weights, Weights),
        phases: tuple[str, str] = ("download", "upload"),
        reliable: bool = False,
    ) -> StarExchange:
        """Server -> clients -> server: download(client) is what the server sends each client (a payload
        of kinds[0]); work(this rank's clients, {client: received}) returns {client: ClientWork}, whose
        models and losses are written here and whose uploads (kinds[1]) go back. Under simulated faults
        only the clients the download reached work, and only the uploads that arrived are returned
        (reliable: no faults apply, for one-time setup exchanges)."""
        ctx = self.ctx
        received = self.broadcast(phases[0], round_index, clients, download, kinds[0], reliable)
        done = work(list(received), received) if received else {}
        losses = torch.full((len(ctx.peers),), math.nan, device=ctx.device)  # NaN: did not train here
        for c, result in done.items():
            if not isinstance(result, ClientWork):
                raise TypeError(f"{type(self).__name__}'s client work returned {type(result).__name__}, not ClientWork")
            if result.model is not None:
                ctx.flat[ctx.row[c]] = result.model
            if result.loss is not None:
                losses[ctx.row[c]] = result.loss
        uploads = {c: (result.upload, result.dense) for c, result in done.items()}
        got = self.collect(phases[1], round_index, clients, uploads, kinds[1], reliable, answering=phases[0])
        return StarExchange(got, losses)

    def broadcast(self, phase, round_index, clients, payload, kind, reliable: bool = False) -> dict:
        """The server sends payload(client) to each client; returns {client: payload} of this rank's
        clients it reached (all of them unless simulated faults lost some)."""
        mine = [c for c in clients if c in self.ctx.row]
        down = [Message(self.server, c, payload(c)) for c in clients] if self.is_server else []
        inbox = self.ctx.transport.exchange(phase, round_index, down, [(self.server, c) for c in mine], kind, reliable)
        return {c: inbox[c][self.server] for c in mine if self.server in inbox[c]}

    def collect(self, phase, round_index, clients, uploads, kind, reliable: bool = False, answering=None) -> dict:
        """This rank's clients send {client: (payload, dense bytes or None)} to the server, which expects
        every client (with answering, those its message of that phase reached); returns {client: payload}
        on the server, {} elsewhere."""
        up = [Message(c, self.server, payload, dense) for c, (payload, dense) in uploads.items()]
        delivered = self.ctx.transport.delivered
        expect = (
            [
                (c, self.server)
                for c in clients
                if reliable or answering is None or delivered(round_index, self.server, c, answering)
            ]
            if self.is_server
            else []
        )
        inbox = self.ctx.transport.exchange(phase, round_index, up, expect, kind, reliable)
        return {c: inbox[self.server][c] for c in clients if c in inbox[self.server]} if self.is_server else {}

    def download(self, round_index: int, client: int) -> Payload:
        return Weights(self.ctx.global_weights)

    def client_work(self, round_index, clients, received) -> dict[int, ClientWork]:
        """Local work of this rank's sampled clients, each from what it received."""
        raise NotImplementedError

    def server_update(self, round_index, clients, uploads) -> torch.Tensor:
        raise NotImplementedError

    def weights_of(self, clients) -> torch.Tensor:
        """Sample-size weights p_c = n_c / sum n over the given clients."""
        n = torch.tensor([len(self.ctx.shards[c]) for c in clients], dtype=torch.float32, device=self.ctx.device)
        return n / n.sum()
