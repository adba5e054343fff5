"""DisPFL (Dai et al. 2022): decentralized personalized sparse training, after rong-dai/DisPFL.

Every peer holds a personal binary mask over its weights (density --dispfl-density, spread over the
layers by ERK). A round, for every peer at once:
  1. send its weights on the coordinates of the mask it trained with, and that mask, to its neighbours;
  2. average each coordinate over the neighbourhood's peers (itself included) whose masks keep it, and
     keep the result on its own current mask: its personalized model;
  3. train that model for the local epochs, re-applying the mask after every step;
  4. update the mask for the next round: drop the smallest-magnitude kept weights of each layer, a
     fraction anneal/2 (1 + cos(pi k / K)) of them, and regrow as many where the gradient of one
     minibatch is largest (or at random), among the coordinates the mask did not keep.
The rounds' models and masks are personal; the run's aggregated model is the same coordinate-wise
average over all peers (over the peers whose weights hold each coordinate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from p2pfl.algorithms.base import Algorithm, Round
from p2pfl.settings.fields import fraction, non_negative, option
from p2pfl.comm import Payload
from p2pfl.gossip.bitpack import pack_mask, unpack_mask
from p2pfl.seeding import keyed_uniform
from p2pfl.local.gradients import gradients
from p2pfl.local.training import local_steps, StepTerms


@dataclass(frozen=True)
class DisPFLSettings:
    dispfl_density: float = option(0.5, "DisPFL: fraction of the weights each peer's mask keeps", fraction)
    dispfl_anneal: float = option(
        0.5, "DisPFL: the mask update's drop rate at round 1 (annealed to 0 by a cosine)", non_negative
    )
    dispfl_regrow: str = option(
        "gradient",
        "DisPFL: regrow where one minibatch's gradient is largest, or at random",
        choices=("gradient", "random"),
    )
    dispfl_erk_power: float = option(1.0, "DisPFL: ERK's exponent of (sum of a layer's dims / its size)", non_negative)
    dispfl_different_masks: bool = option(False, "DisPFL: draw each peer's initial mask from its own seed")
    dispfl_clip: float = option(
        10.0, "DisPFL: the largest gradient 2-norm of a local step (0: no clipping)", non_negative
    )


@dataclass
class SparseWeights(Payload):
    values: torch.Tensor  # the trainable weights on the kept coordinates, in order
    mask: torch.Tensor  # the kept coordinates, as bits
    buffers: torch.Tensor  # state buffers (batch norm statistics), dense


def mask_positions(mask: torch.Tensor, count: int) -> torch.Tensor:
    """(rows, count): the positions of each row's True entries in order, for masks (rows, width) of count
    True entries each; what boolean indexing finds, without the host sync that indexing by a mask costs
    on a GPU (it must learn how many there are)."""
    rank = mask.to(torch.int32).cumsum(1, dtype=torch.int32).long() - 1
    slot = torch.where(mask, rank, torch.full_like(rank, count))  # the False entries: a slot dropped below
    out = torch.zeros(len(mask), count + 1, dtype=torch.long, device=mask.device)
    return out.scatter_(1, slot, torch.arange(mask.shape[1], device=mask.device).expand_as(slot))[:, :count]


def erk_densities(shapes: list[tuple[int, ...]], density: float, power: float = 1.0) -> list[float]:
    """Each layer's density so that the kept total is density x all weights, each layer's proportional
    to (sum of its dims / its size)^power (Erdos-Renyi-kernel), a layer that would exceed 1 made dense
    and the rest solved again (DisPFL's calculate_sparsities)."""
    sizes = [math.prod(s) for s in shapes]
    raw = [(sum(s) / n) ** power for s, n in zip(shapes, sizes)]
    dense: set[int] = set()
    while True:
        free = [i for i in range(len(shapes)) if i not in dense]
        rhs = sum(density * sizes[i] for i in free) - sum((1 - density) * sizes[i] for i in dense)
        eps = rhs / sum(raw[i] * sizes[i] for i in free)
        worst = max(raw[i] for i in free)
        if worst * eps <= 1:
            return [1.0 if i in dense else eps * raw[i] for i in range(len(shapes))]
        dense.update(i for i in free if raw[i] == worst)


class DisPFL(Algorithm):
    name = "dispfl"
    summary = "DisPFL: personalized sparse masks, mask-wise neighbour averaging"
    Settings = DisPFLSettings
    state = {"mask": "peer", "trained_mask": "peer"}
    # lr x0.998 a round (lr_decay = -ln 0.998 to 4 digits): DisPFL's own schedule
    training = {
        "lr": 0.1,
        "lr_decay": 0.002002,
        "batch_size": 10,
        "local_epochs": 10,
        "momentum": 0.0,
        "weight_decay": 5e-4,
    }

    def __init__(self, ctx):
        super().__init__(ctx)
        layout = ctx.stack.layout
        self.width = layout.trainable
        self.slots = layout.slots[: layout.n_params]
        self.densities = erk_densities(
            [s.shape for s in self.slots], self.settings.dispfl_density, self.settings.dispfl_erk_power
        )
        self.mask = (
            torch.stack([self.initial_mask(p) for p in ctx.peers]).to(ctx.device)
            if ctx.peers
            else torch.zeros(0, self.width, dtype=torch.bool, device=ctx.device)
        )
        self.trained_mask = self.mask.clone()  # the mask each peer's current weights were trained with
        # every mask keeps this many weights (each layer's count is kept through prune and regrow), so a
        # message's values are found without asking the device how many there are
        self.kept = sum(int(d * s.numel) for s, d in zip(self.slots, self.densities))
        ctx.flat[:, : self.width] *= self.mask

    def initial_mask(self, peer: int) -> torch.Tensor:
        gen = self.ctx.generator("dispfl-mask", peer if self.settings.dispfl_different_masks else 0)
        mask = torch.zeros(self.width, dtype=torch.bool)
        for slot, d in zip(self.slots, self.densities):
            keep = torch.randperm(slot.numel, generator=gen)[: int(d * slot.numel)]
            mask[slot.offset + keep] = True
        return mask

    def work_steps(self, n_samples: int) -> int:
        return local_steps(n_samples, self.ctx.sgd())

    def notes(self) -> list[str]:
        kept = sum(int(d * s.numel) for s, d in zip(self.slots, self.densities))
        return [
            f"DisPFL masks keep {kept:,} of {self.width:,} weights ({kept / self.width:.3f}); ERK layer "
            f"densities {', '.join(f'{d:.2f}' for d in self.densities)}"
        ]

    def round(self, round_index: int) -> Round:
        ctx = self.ctx
        offline = ctx.offline_rows(round_index)  # simulated faults: they keep weights and masks
        personal = self.aggregate(round_index)
        personal[:, : self.width] *= self.mask
        personal[offline] = ctx.flat[offline]
        trained_mask = self.mask.clone()
        trained_mask[offline] = self.trained_mask[offline]
        self.trained_mask = trained_mask
        opt = ctx.sgd(clip=self.settings.dispfl_clip)
        losses = ctx.train_online(round_index, personal, opt, StepTerms(mask=self.mask.to(personal.dtype)))
        ctx.flat = personal
        mask = self.next_masks(round_index)
        mask[offline] = self.mask[offline]
        self.mask = mask
        return Round(losses)

    def aggregate(self, round_index: int) -> torch.Tensor:
        """Every local peer's neighbourhood average, each coordinate over the peers whose trained masks
        keep it (0 where none does); buffers uniformly."""
        ctx, width = self.ctx, self.width
        graph = ctx.schedule.graph(round_index)
        dense = ctx.flat.shape[1] * ctx.flat.element_size()
        values = ctx.flat[:, :width].gather(1, mask_positions(self.trained_mask, self.kept))
        sends = {
            p: (SparseWeights(values[i], pack_mask(self.trained_mask[i]), ctx.flat[i, width:]), dense)
            for i, p in enumerate(ctx.peers)
        }
        inbox = ctx.neighbour_exchange("average", round_index, SparseWeights, sends)
        out = torch.zeros_like(ctx.flat)
        for i, p in enumerate(ctx.peers):
            group = [(ctx.flat[i], self.trained_mask[i])] + [
                self.decode(inbox[p][j]) for j in sorted(graph.neighbors(p)) if j in inbox[p]
            ]  # what arrived
            weights = torch.stack([w for w, _ in group])  # zero off each sender's mask
            count = torch.stack([kept for _, kept in group]).sum(0)
            total = weights[:, :width].sum(0)
            out[i, :width] = torch.where(count > 0, total / count.clamp(min=1), torch.zeros_like(total))
            out[i, width:] = weights[:, width:].mean(0)
        return out

    def decode(self, message: SparseWeights) -> tuple[torch.Tensor, torch.Tensor]:
        """A neighbour's dense weights (zero off its mask) and its mask."""
        ctx, width = self.ctx, self.width
        kept = unpack_mask(message.mask, width)
        dense = torch.zeros(ctx.flat.shape[1], device=ctx.device)
        dense[:width].scatter_(0, mask_positions(kept[None], len(message.values))[0], message.values)
        dense[width:] = message.buffers
        return dense, kept

    def next_masks(self, round_index: int) -> torch.Tensor:
        """Prune and regrow each peer's mask, layer by layer, keeping every layer's count."""
        ctx = self.ctx
        drop = self.settings.dispfl_anneal / 2 * (1 + math.cos(math.pi * round_index / ctx.cfg.rounds))
        score = self.regrow_scores(round_index)
        new = self.mask.clone()
        for slot in self.slots:  # every peer keeps the same count of a layer, so n is the same for all
            part = slice(slot.offset, slot.offset + slot.numel)
            kept, weights = self.mask[:, part], ctx.flat[:, part]
            held = int(kept[0].sum()) if len(kept) else 0
            n = min(math.ceil(drop * held), slot.numel - held)
            if n == 0:
                continue
            magnitude = torch.where(kept, weights.abs(), torch.full_like(weights, math.inf))
            pruned = torch.sort(magnitude, dim=1, stable=True).indices[:, :n]
            grow = torch.where(~kept, score[:, part], torch.full_like(weights, -math.inf))
            grown = torch.sort(grow, dim=1, descending=True, stable=True).indices[:, :n]
            layer = new[:, part]
            layer.scatter_(1, pruned, False)
            layer.scatter_(1, grown, True)
        return new

    def regrow_scores(self, round_index: int) -> torch.Tensor:
        """(peers, trainable): |gradient| of one minibatch at the trained weights, or uniform noise (a
        random regrowth)."""
        ctx = self.ctx
        if self.settings.dispfl_regrow == "random":
            return keyed_uniform(ctx.peer_keys("dispfl-regrow", round_index), self.width)
        index, mask = ctx.minibatch(round_index)
        grad, _ = gradients(ctx.stack, ctx.flat.clone(), ctx.data.train_x[index], ctx.data.train_y[index], mask)
        return grad.abs()

    def aggregate_coefficients(self, flat: torch.Tensor) -> torch.Tensor:
        """All peers' models averaged coordinate by coordinate over the peers whose weights hold it: each
        trainable coordinate weighs 1 where a peer's mask keeps it (its weight is not 0), the rest 1."""
        held = torch.ones_like(flat)
        held[:, : self.width] = (flat[:, : self.width] != 0).to(flat.dtype)
        return held
