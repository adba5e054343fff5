"""What the factored kernel reuses of a peer's inputs: their 8-bit pixel codes where they are pixels
(exact integer products, p2pfl.ntk.pixels), else their Gram. A peer's block is in the kernel of every
neighbourhood it belongs to and unchanged while its samples are, so a rank keeps them (within a budget)."""

from __future__ import annotations

import torch

from p2pfl.ntk.pixels import PixelInputs

INPUTS_CACHE_BYTES = 256 * 2**20  # the inputs' codes or Grams a rank keeps (94 or 48 MB at 300 peers x 200 samples)


class InputsCache:
    def __init__(self, data, budget: int | None = None):
        self.data = data  # its pixel_levels: None where the inputs are not pixels
        self.budget = INPUTS_CACHE_BYTES if budget is None else budget
        self.kept: dict[tuple[int, bytes], PixelInputs | torch.Tensor] = {}  # by (peer, its sample indices)
        self.bytes = 0

    def keep_only(self, used: dict[int, list[torch.Tensor]]) -> None:
        """Drop the blocks of samples the round does not use ({peer: its index tensors})."""
        keys = {(p, index.numpy().tobytes()) for p, parts in used.items() for index in parts}
        self.kept = {key: kept for key, kept in self.kept.items() if key in keys}
        self.bytes = sum(_nbytes(kept) for kept in self.kept.values())

    def block(self, peer: int, jac, index: torch.Tensor) -> PixelInputs | torch.Tensor:
        """The peer's block for these samples (from the Jacobian as received: its first factor holds the
        inputs), from the cache or computed (and kept, within budget)."""
        key = (peer, index.numpy().tobytes())
        kept = self.kept.get(key)
        if kept is None:
            kept = PixelInputs.encode(jac.acts[0], self.data.pixel_levels)
            if kept is None:
                kept = jac.input_gram()
            if self.bytes + _nbytes(kept) <= self.budget:
                self.kept[key] = kept
                self.bytes += _nbytes(kept)
        return kept


def on_device(indices: dict[int, torch.Tensor], device: torch.device) -> dict[int, torch.Tensor]:
    """The same index tensors on device, in one copy (one per peer was about 900 copies a round)."""
    keys = list(indices)
    if not keys:
        return {}
    moved = torch.cat([indices[k] for k in keys]).to(device).split([len(indices[k]) for k in keys])
    return dict(zip(keys, moved))


def _nbytes(kept: PixelInputs | torch.Tensor) -> int:
    return kept.nbytes if isinstance(kept, PixelInputs) else kept.numel() * kept.element_size()
