"""A peer's NTK evolution problem over its neighbourhood: its own Jacobian and the ones it received
stacked (with the inputs' pixel codes or Grams the factored kernel reuses), and the samples its
candidate t is selected on."""

from __future__ import annotations

import numpy as np
import torch

from p2pfl.local.forward import candidate_losses
from p2pfl.ntk.pixels import PixelInputs
from p2pfl.ntk.step import NTKProblem


def round_samples(shard: np.ndarray, batches: int, subsample: int, rng: np.random.Generator) -> list[torch.Tensor]:
    """A peer's training indices used in a round (1/subsample of its shard, drawn with rng), split into
    the Jacobian batches."""
    if subsample > 1:
        shard = np.sort(rng.choice(shard, max(1, len(shard) // subsample), False))
    parts = np.array_split(shard, min(batches, len(shard)))
    return [torch.from_numpy(parts[b % len(parts)]) for b in range(batches)]


def neighbourhood_problem(stack, training_rows, codec, inputs, settings, peer, hood, parts, w, samples) -> NTKProblem:
    """parts: (Jacobian, outputs, labels) of each member of hood, in order; samples: their sample indices
    on the CPU (the inputs cache's keys) and on the device; training_rows(index, inputs): the training
    (x, y) at index (x None where inputs is False). settings.ntk_selection 'own' selects t on the peer's
    own samples, else on the neighbourhood's (with settings.ntk_loss)."""
    data, placed = samples
    blocks = (
        [inputs.block(j, part[0], data[j]) for j, part in zip(hood, parts)]
        if codec.path == "factored"
        else [None] * len(hood)
    )
    pixels = PixelInputs.cat(blocks) if all(isinstance(b, PixelInputs) for b in blocks) else None
    grams = None if pixels is not None else [b if isinstance(b, torch.Tensor) else None for b in blocks]
    jac = codec.cat([part[0] for part in parts], grams, pixels)
    f0, labels = torch.cat([part[1] for part in parts]), torch.cat([part[2] for part in parts])
    own_only = settings.ntk_selection == "own"
    selection_pixels = None if pixels is None else blocks[hood.index(peer)] if own_only else pixels
    index = torch.cat([placed[j] for j in ([peer] if own_only else hood)])
    x, y = training_rows(index, selection_pixels is None)
    return NTKProblem(
        jac, w, f0, labels, lambda cands: candidate_losses(stack, cands, x, y, settings.ntk_loss, selection_pixels)
    )
