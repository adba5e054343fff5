"""What every algorithm gets (RunContext): the run's data, model, peers and graph, and the verbs algorithms
repeat: local training, keyed random numbers, an exchange with neighbours, the peer-to-row map."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
import torch

from p2pfl.comm import Message, Payload, Transport
from p2pfl.settings.run_config import RunConfig
from p2pfl.data import Dataset
from p2pfl.comm.clock import Network
from p2pfl.comm.faults import Faults
from p2pfl.local.gradients import PrivateStep, gradients, private_gradients
from p2pfl.models import PeerStack
from p2pfl.seeding import numpy_rng, peer_keys, torch_generator
from p2pfl.local.training import SGDSettings, StepTerms, sample_batch, train_epochs
from p2pfl.threats import Threats
from topologies import TopologySchedule, in_neighbours


@dataclass
class RunContext:
    """What an algorithm gets from the run (its `ctx`): the settings, the data and its partition, the
    graph, the model and this rank's peers' weights, and the verbs algorithms repeat: local training
    (train, train_online, sgd), keyed random numbers that do not depend on how peers sit on ranks (rng,
    generator, minibatch), exchanges with neighbours or between server and clients (neighbour_exchange,
    ...), and the peer-to-row map (row). The loop builds it once per run; algorithms never build one."""

    cfg: RunConfig  # every setting of the run, resolved (the algorithm's own in cfg.settings)
    transport: Transport  # messages and collectives between ranks; counts the bytes
    data: Dataset  # tensors on the run's device
    shards: list[torch.Tensor]  # every peer's training indices (all ranks know the partition)
    schedule: TopologySchedule  # the graph of each round (schedule.graph(k))
    stack: PeerStack  # the model, run as one batched function of every peer's weights
    peers: list[int]  # the peers this rank hosts
    flat: torch.Tensor  # (len(peers), D) their parameters
    device: torch.device  # where the weights and data live, decided once per run
    global_weights: torch.Tensor | None = None  # a star's server model (rank 0); None: average all peers
    faults: Faults | None = None  # simulated faults, where any are asked for
    network: Network = field(default_factory=lambda: Network(0))  # the virtual clock's model (p2pfl.comm.clock)
    threats: Threats | None = None  # Byzantine peers and a robust rule, where any are asked for (p2pfl.threats)
    _on_device: tuple = field(default=(None, {}), repr=False)  # (the shards list, {peer: its indices there})

    # -- the peers and their data -----------------------------------------------------------------------
    @functools.cached_property
    def row(self) -> dict[int, int]:
        """{peer: its row of flat} for this rank's peers."""
        return {p: i for i, p in enumerate(self.peers)}

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

    def labels(self, index: torch.Tensor) -> torch.Tensor:
        """The training targets at index alone (where the inputs are not wanted)."""
        return self.data.train_y[index.to(self.device)]

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

    def evaluates(self, round_index: int) -> bool:
        """Whether the run evaluates after this round (every --eval-every rounds and after the last)."""
        return round_index == self.cfg.rounds - 1 or (round_index + 1) % self.cfg.eval_every == 0

    # -- keyed random numbers: the same draws on any layout of peers over ranks ------------------------------
    def rng(self, purpose: str, *keys: int) -> np.random.Generator:
        return numpy_rng(self.cfg.seed, purpose, *keys)

    def generator(self, purpose: str, *keys: int) -> torch.Generator:
        return torch_generator(self.cfg.seed, purpose, *keys)

    def peer_keys(self, purpose: str, round_index: int) -> torch.Tensor:
        """One key per peer of this rank, on the device (for draws made there)."""
        return peer_keys(self.cfg.seed, purpose, round_index, self.peers, self.device)

    def minibatch(self, round_index: int, size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One minibatch per peer of this rank (--batch-size by default): indices and mask (peers, size)."""
        return sample_batch(
            self.local_shards, size or self.cfg.batch_size, self.cfg.seed, round_index, self.peers, self.device
        )

    # -- local training ---------------------------------------------------------------------------------
    def lr(self, round_index: int) -> float:
        """lr_k = lr * exp(-decay * k), the NTK-DFL reference code's schedule (decay 0: constant)."""
        return self.cfg.lr * math.exp(-self.cfg.lr_decay * round_index)

    def sgd(self, **changes) -> SGDSettings:
        """Local SGD's settings from the run's, with an algorithm's changes (steps=, prox_mu=, clip=)."""
        c = self.cfg
        private = {"dp_clip": c.dp_clip, "dp_noise": c.dp_noise} if c.dp_clip else {}
        return SGDSettings(c.batch_size, c.local_epochs, c.momentum, c.weight_decay, **{**private, **changes})

    def train(
        self,
        round_index: int | list[int],
        flat: torch.Tensor,
        peers: list[int],
        opt: SGDSettings | None = None,
        terms: StepTerms | None = None,
        *,
        shards: list[torch.Tensor] | None = None,
        data: tuple[torch.Tensor, torch.Tensor] | None = None,
        lr: float | None = None,
    ) -> torch.Tensor:
        """Local SGD of the given peers, in place on flat (a row per peer): their own shards of the training
        set by default, the round's lr and the run's settings; returns each one's mean training loss."""
        x, y = data if data is not None else (self.data.train_x, self.data.train_y)
        return train_epochs(
            self.stack,
            flat,
            shards if shards is not None else [self.shards[p] for p in peers],
            peers,
            x,
            y,
            opt or self.sgd(),
            self.lr(round_index) if lr is None else lr,
            self.cfg.seed,
            round_index,
            terms,
        )

    def train_online(
        self, round_index: int, flat: torch.Tensor, opt: SGDSettings | None = None, terms: StepTerms | None = None
    ) -> torch.Tensor:
        """Local SGD of this rank's peers that take part in the round (all of them without simulated
        faults), in place on flat (one row per peer of the rank); an offline peer keeps its weights and
        reports a NaN loss."""
        rows = self.online_rows(round_index)
        if len(rows) == len(self.peers):
            return self.train(round_index, flat, self.peers, opt, terms)
        losses = torch.full((len(self.peers),), math.nan, device=self.device)
        if rows:
            part = flat[rows]
            losses[rows] = self.train(
                round_index, part, [self.peers[i] for i in rows], opt, terms.rows(rows) if terms else None
            )
            flat[rows] = part
        return losses

    def stochastic_gradients(
        self, round_index: int, opt: SGDSettings
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One minibatch gradient per peer of the rank at its weights (D-PSGD's and CHOCO-SGD's step):
        (gradients, losses with NaN for offline peers, the rows that step: online with samples)."""
        index, mask = self.minibatch(round_index, opt.batch_size)
        noise = (
            self.stack.dropout_noise(self.peer_keys("dropout", round_index), opt.batch_size)
            if self.stack.dropouts
            else None
        )
        x, y = self.data.train_x[index], self.data.train_y[index]
        if opt.dp_clip:  # each sample's gradient clipped, the sum noised (DP-SGD)
            keys = [(self.cfg.seed, "dp-noise", round_index, p) for p in self.peers]
            grad, losses = private_gradients(
                self.stack, self.flat, x, y, mask, PrivateStep(opt.dp_clip, opt.dp_noise, opt.batch_size, keys)
            )
        else:
            grad, losses = gradients(self.stack, self.flat, x, y, mask, noise)
        stepping = mask.sum(1) > 0
        offline = self.offline_rows(round_index)
        stepping[offline] = False
        losses[offline] = float("nan")
        return grad, losses, stepping

    def objective_gradients(self, round_index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """stochastic_gradients of each peer's whole objective, weight decay included (--weight-decay): what
        the optimizers of the decentralized-optimization papers (gradient tracking, D², SGP, QG-DSGDm) step,
        track and difference; rows that do not step (offline, no samples) get a zero gradient."""
        grad, losses, stepping = self.stochastic_gradients(round_index, self.sgd())
        if self.cfg.weight_decay:
            grad.add_(self.flat[:, : grad.shape[1]], alpha=self.cfg.weight_decay)
        grad.mul_(stepping[:, None])
        return grad, losses, stepping

    # -- exchanges --------------------------------------------------------------------------------------
    def neighbour_exchange(
        self,
        phase: str,
        round_index: int,
        kind: type[Payload],
        sends: dict[int, Payload | tuple[Payload, int]] | list[Message],
        receivers: set[int] | None = None,
        answering: str | None = None,
    ) -> dict:
        """One synchronous exchange on the round's graph: sends is {peer: payload, or (payload, dense
        bytes)} for each of this rank's peers, sent to all its neighbours, or the messages themselves.
        Each peer of the rank (in receivers, if given) expects every neighbour to send (on a directed
        graph: sends go to out-neighbours, and a peer hears its in-neighbours), or, with
        answering, those its message of that earlier phase reached (simulated faults). Returns
        {peer: {sender: payload}}."""
        graph = self.schedule.graph(round_index)
        if isinstance(sends, dict):
            sends = [
                Message(p, j, *(s if isinstance(s, tuple) else (s,)))
                for p, s in sends.items()
                for j in graph.neighbors(p)
            ]
        expect = [
            (j, p)
            for p in self.peers
            if receivers is None or p in receivers
            for j in in_neighbours(graph, p)
            if answering is None or self.transport.delivered(round_index, p, j, answering)
        ]
        return self.transport.exchange(phase, round_index, sends, expect, kind)
