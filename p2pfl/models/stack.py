"""The peers of one rank as one flat (peers, parameters) tensor, evaluated as one vmap batch.

A flat layout makes messages, averaging and gathers single tensors, and lets a rank's peers train as
one batch: functional_call + vmap over the stacked parameters (DESIGN, "a rank's peers are one batch").
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, vmap

from p2pfl.seeding import torch_generator


@dataclass(frozen=True)
class Slot:
    name: str
    shape: tuple[int, ...]
    offset: int
    numel: int


class ParamLayout:
    """Where each named parameter of a model sits in its flat vector."""

    def __init__(self, model: nn.Module):
        self.slots: list[Slot] = []
        offset = 0
        for name, p in model.named_parameters():
            self.slots.append(Slot(name, tuple(p.shape), offset, p.numel()))
            offset += p.numel()
        self.size = offset

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Named views into flat, which is (D,) or (L, D)."""
        lead = flat.shape[:-1]
        return {s.name: flat[..., s.offset:s.offset + s.numel].view(*lead, *s.shape) for s in self.slots}

    def flatten(self, model: nn.Module) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


class PeerStack:
    """Forward passes of many peers' models that share one architecture."""

    def __init__(self, model: nn.Module, batched: bool = True):
        self.model = model
        self.layout = ParamLayout(model)
        self.batched = batched

    def forward(self, flat: torch.Tensor, x: torch.Tensor, shared_input: bool = False) -> torch.Tensor:
        """flat (L, D); x (L, B, ...) or, with shared_input, (B, ...) for all peers -> (L, B, classes)."""
        return self.forward_views(self.layout.views(flat), x, shared_input)

    def forward_views(self, params: dict[str, torch.Tensor], x: torch.Tensor,
                      shared_input: bool = False) -> torch.Tensor:
        """As forward, from named (L, ...) parameter tensors."""
        call = lambda p, xb: functional_call(self.model, p, (xb,))  # noqa: E731
        if self.batched:
            return vmap(call, in_dims=(0, None if shared_input else 0))(params, x)
        rows = next(iter(params.values())).shape[0]
        return torch.stack([call({k: v[i] for k, v in params.items()}, x if shared_input else x[i])
                            for i in range(rows)])


def initial_parameters(model: nn.Module, peers: list[int], seed: int, init: str,
                       device: torch.device) -> torch.Tensor:
    """(len(peers), D): one shared initial model ('same') or one per peer ('different')."""
    layout = ParamLayout(model)
    rows = []
    for peer in peers:
        model.reset(torch_generator(seed, "init", 0 if init == "same" else peer))
        rows.append(layout.flatten(model))
    return torch.stack(rows).to(device) if rows else torch.zeros(0, layout.size, device=device)
