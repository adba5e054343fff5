"""Where each parameter and float buffer of a model sits in its flat vector (a peer's row of the stack):
the trainable parameters first, then the float buffers (batch norm's running statistics)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Slot:
    name: str
    shape: tuple[int, ...]
    offset: int
    numel: int


def _state_buffers(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Persistent float buffers (running means and variances), not counters or per-step noise."""
    out = []
    for mod_name, module in model.named_modules():
        for name, buf in module.named_buffers(recurse=False):
            if name not in module._non_persistent_buffers_set and buf.is_floating_point():
                out.append((f"{mod_name}.{name}" if mod_name else name, buf))
    return out


class ParamLayout:
    """Where each named parameter and state buffer of a model sits in its flat vector."""

    def __init__(self, model: nn.Module):
        self.slots: list[Slot] = []
        offset = 0
        for name, p in [*model.named_parameters(), *_state_buffers(model)]:
            self.slots.append(Slot(name, tuple(p.shape), offset, p.numel()))
            offset += p.numel()
        self.size = offset
        self.trainable = sum(p.numel() for p in model.parameters())  # flat[..., :trainable] are parameters
        self.n_params = len(list(model.parameters()))

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Named views into flat, which is (D,) or (L, D)."""
        lead = flat.shape[:-1]
        return {s.name: flat[..., s.offset : s.offset + s.numel].view(*lead, *s.shape) for s in self.slots}

    def flatten(self, model: nn.Module) -> torch.Tensor:
        tensors = [*model.parameters(), *(b for _, b in _state_buffers(model))]
        return torch.cat([t.detach().reshape(-1).float() for t in tensors])
