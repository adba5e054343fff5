"""CyclicFL (Zhang et al. 2023, arXiv v1): cyclic pre-training, then a standard FL algorithm.

Phase 1, for --cyclic-rounds rounds: the server samples --cyclic-fraction of the clients uniformly
without replacement, in a random order, and the one model travels server -> client 1 -> server ->
client 2 ... (Algorithm 1; both hops of every visit are messages), each client taking at most
--cyclic-steps SGD steps (and at most one epoch, unless --cyclic-step-policy exact) from what it
received. Nothing is averaged; the last client's model starts the next round.
Phase 2 runs --then (FedAvg, FedProx, SCAFFOLD or MOON) from that model for the remaining rounds, so
phase 1's rounds count towards --rounds, as in the paper's tables.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from p2pfl.algorithms.star.fedavg import FedAvg
from p2pfl.algorithms.star.fedprox import FedProx, FedProxSettings
from p2pfl.algorithms.star.scaffold import Scaffold
from p2pfl.algorithms.star.moon import Moon, MoonSettings
from p2pfl.algorithms.base import Round
from p2pfl.algorithms.server import ClientWork, ServerAlgorithm
from p2pfl.settings.fields import fraction, option, positive
from p2pfl.comm import Weights
from p2pfl.errors import UserError
from p2pfl.measure.metrics import declare_metric

declare_metric("phase", meaning="CyclicFL: `cyclic` or the second phase's algorithm", unit="name")

THEN = {cls.name: cls for cls in (FedAvg, FedProx, Scaffold, Moon)}  # phase 2's algorithms
PAPER_FL_ROUNDS = 900  # the paper's 1,000 rounds in all, 100 of them cyclic


@dataclass(frozen=True)
class CyclicSettings(FedProxSettings, MoonSettings):  # the phase-2 algorithms' settings, too
    then: str = option("fedavg", "phase 2's algorithm", choices=tuple(THEN))
    cyclic_rounds: int = option(100, "phase 1's rounds of cyclic pre-training (they count towards --rounds)", positive)
    cyclic_fraction: float = option(0.25, "fraction of the clients visited in each phase-1 round", fraction)
    cyclic_steps: int = option(20, "the most SGD steps of a client on a phase-1 visit", positive)
    cyclic_step_policy: str = option(
        "one-epoch",
        "one-epoch: --cyclic-steps but at most one pass over the "
        "client's data (the paper's 'maximum'); exact: always --cyclic-steps, "
        "cycling through the data",
        choices=("one-epoch", "exact"),
    )


class Cyclic(ServerAlgorithm):
    name = "cyclic"
    summary = "CyclicFL: the model relayed through sampled clients, then --then from it"
    Settings = CyclicSettings
    setting_defaults = {"clients_per_round": 10}  # phase 2: the paper's 10% of 100 clients
    training = {"lr": 0.01, "batch_size": 32, "local_epochs": 5, "momentum": 0.0}

    def __init__(self, ctx):
        super().__init__(ctx)
        self.then = THEN[self.settings.then](ctx)  # phase 2 shares ctx, so it starts from the chain's model

    @classmethod
    def rounds(cls, settings, given):
        if given is not None and given <= settings.cyclic_rounds:
            raise UserError(
                f"--rounds {given} leaves no phase 2 after --cyclic-rounds "
                f"{settings.cyclic_rounds}; give --rounds above it"
            )
        return settings.cyclic_rounds + PAPER_FL_ROUNDS if given is None else given

    @property
    def state(self):
        return {f"then.{name}": kind for name, kind in self.then.state.items()}

    def visits(self) -> int:
        return max(1, math.floor(self.settings.cyclic_fraction * self.ctx.cfg.peers))

    def notes(self) -> list[str]:
        s = self.settings
        steps = f"{s.cyclic_steps}" if s.cyclic_step_policy == "exact" else f"min({s.cyclic_steps}, one epoch)"
        return [
            f"phase 1 (rounds 1-{s.cyclic_rounds}): {self.visits()} of {self.ctx.cfg.peers} clients in turn, "
            f"{steps} steps each; phase 2: {s.then}, {self.per_round} clients per round"
        ]

    def phase(self, round_index: int) -> str:
        return "cyclic" if round_index < self.settings.cyclic_rounds else self.settings.then

    def round(self, round_index):
        if round_index >= self.settings.cyclic_rounds:
            result = self.then.round(round_index)
            result.fields["phase"] = self.phase(round_index)
            return result
        ctx = self.ctx
        order = ctx.rng("cyclic", round_index).choice(ctx.cfg.peers, self.visits(), replace=False)
        losses = torch.full((len(ctx.peers),), math.nan, device=ctx.device)
        for client in order.tolist():
            done = self.star_round(
                round_index,
                [client],
                download=lambda c: Weights(ctx.global_weights),
                work=lambda mine, received: self.visit(round_index, mine, received),
                phases=("cyclic-down", "cyclic-up"),
            )
            losses = torch.where(done.losses.isnan(), losses, done.losses)  # a client visited twice: its last
            if self.is_server and client in done.uploads:  # under faults a visit may fail: the model stays
                ctx.global_weights = done.uploads[client].weights
        return Round(losses, {"phase": "cyclic"})

    def visit(self, round_index, clients, received):
        """One client's steps from the model it received; it keeps a copy as its own model."""
        ctx, (client,) = self.ctx, clients
        steps = self.settings.cyclic_steps
        if self.settings.cyclic_step_policy == "one-epoch":
            steps = min(steps, math.ceil(len(ctx.shards[client]) / ctx.cfg.batch_size))
        flat = received[client].weights[None].clone()
        loss = ctx.train(round_index, flat, [client], ctx.sgd(steps=steps))
        return {client: ClientWork(Weights(flat[0]), flat[0], loss[0])}
