"""Bits as they travel: b-bit values (quantized Jacobian entries) and boolean masks (which entries a
sparse message holds: top-k Jacobians, DisPFL's sparse models) packed into bytes, so that a message's
byte count is what a real wire would carry."""

from __future__ import annotations

import numpy as np
import torch


def pack_bits(q: np.ndarray, bits: int) -> np.ndarray:
    """Values below 2**bits (uint8) as a bit stream of bits bits each."""
    return np.packbits(np.unpackbits(q.astype(np.uint8)[:, None], axis=1)[:, 8 - bits :].reshape(-1))


def unpack_bits(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """pack_bits' inverse: count values of bits bits each."""
    planes = np.unpackbits(packed)[: count * bits].reshape(count, bits)
    return np.packbits(np.pad(planes, ((0, 0), (8 - bits, 0))), axis=1)[:, 0]


def pack_mask(mask: torch.Tensor) -> torch.Tensor:
    """A boolean vector as bits: numel/8 bytes (uint8), on the mask's device (no trip to the host)."""
    return pack_mask_rows(mask.detach().reshape(1, -1))[0]


def unpack_mask(packed: torch.Tensor, numel: int) -> torch.Tensor:
    """pack_mask's inverse: the first numel bits as a boolean vector, on packed's device."""
    return unpack_mask_rows(packed[None], numel)[0]


def pack_rows(values: torch.Tensor, bits: int) -> torch.Tensor:
    """Each row of b-bit values (R, D), uint8 below 2**bits) as pack_bits packs one: (R, ceil(D b / 8))
    bytes, the first value in the highest bits; on the values' device, all rows in one pass where b divides
    8 (a compressed round's many messages), else row by row through pack_bits."""
    rows, count = values.shape
    if 8 % bits:
        return torch.stack([torch.from_numpy(pack_bits(v.cpu().numpy(), bits)) for v in values]).to(values.device)
    per_byte = 8 // bits
    padded = torch.cat([values, values.new_zeros(rows, -count % per_byte)], 1).view(rows, -1, per_byte)
    shifts = torch.arange(per_byte - 1, -1, -1, device=values.device, dtype=torch.uint8) * bits
    return (padded << shifts).sum(2, dtype=torch.uint8)


def unpack_rows(packed: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """pack_rows' inverse: (R, count) uint8 values from (R, bytes) packed rows."""
    if 8 % bits:
        return torch.stack([torch.from_numpy(unpack_bits(p.cpu().numpy(), bits, count)) for p in packed]).to(
            packed.device
        )
    per_byte = 8 // bits
    shifts = torch.arange(per_byte - 1, -1, -1, device=packed.device, dtype=torch.uint8) * bits
    return ((packed[:, :, None] >> shifts) & (2**bits - 1)).reshape(len(packed), -1)[:, :count]


def pack_mask_rows(mask: torch.Tensor) -> torch.Tensor:
    """Each row of a boolean (R, D) matrix as pack_mask packs one: (R, ceil(D / 8)) bytes."""
    return pack_rows(mask.to(torch.uint8), 1)


def unpack_mask_rows(packed: torch.Tensor, count: int) -> torch.Tensor:
    return unpack_rows(packed, 1, count).bool()
