"""Jacobian compression (NTK-DFL appendix D.2, CP-NTK-FL): top-k sparsification, b-bit quantization of
what is kept (really bit-packed, so the byte count is honest), and a shared-seed Gaussian projection
of the inputs that shrinks the model's input size. Its bitmask helpers also carry DisPFL's masks."""
from __future__ import annotations

import math

import numpy as np
import torch

from p2pfl.seeding import torch_generator


def _pack_bits(q: np.ndarray, bits: int) -> np.ndarray:
    return np.packbits(np.unpackbits(q.astype(np.uint8)[:, None], axis=1)[:, 8 - bits:].reshape(-1))


def _unpack_bits(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    planes = np.unpackbits(packed)[: count * bits].reshape(count, bits)
    return np.packbits(np.pad(planes, ((0, 0), (8 - bits, 0))), axis=1)[:, 0]


_BITS = (128, 64, 32, 16, 8, 4, 2, 1)  # numpy's packbits order: the first element is the highest bit


def pack_mask(mask: torch.Tensor) -> torch.Tensor:
    """A boolean vector as bits: numel/8 bytes (uint8), on the mask's device (no trip to the host)."""
    bits = mask.detach().reshape(-1).to(torch.uint8)
    bits = torch.cat([bits, bits.new_zeros(-len(bits) % 8)]).view(-1, 8)
    return (bits * torch.tensor(_BITS, dtype=torch.uint8, device=bits.device)).sum(1).to(torch.uint8)


def unpack_mask(packed: torch.Tensor, numel: int) -> torch.Tensor:
    """pack_mask's inverse: the first numel bits as a boolean vector, on packed's device."""
    bits = packed[:, None] & torch.tensor(_BITS, dtype=torch.uint8, device=packed.device)
    return (bits != 0).reshape(-1)[:numel]


def encode(J: torch.Tensor, keep: float = 1.0, bits: int = 0) -> tuple[torch.Tensor, ...]:
    """A dense Jacobian as (shape, indices, values[, range]): the largest-magnitude keep fraction of its
    entries, their values quantized to `bits` bits between their min and max when bits > 0."""
    flat = J.reshape(-1)
    k = max(1, math.ceil(keep * flat.numel())) if keep < 1 else flat.numel()
    index = flat.abs().topk(k, sorted=False).indices.sort().values if k < flat.numel() else None
    values = flat[index] if index is not None else flat
    shape = torch.tensor(J.shape, dtype=torch.int64)
    head = (shape, _positions(index, flat.numel()))
    if not bits:
        return (*head, values.float())
    lo, hi = values.min(), values.max()
    scale = (hi - lo).clamp(min=1e-30)
    q = torch.round((values - lo) / scale * (2**bits - 1)).to(torch.uint8).cpu().numpy()
    packed = torch.from_numpy(_pack_bits(q, bits))
    return (*head, packed, torch.stack([lo, hi]).float(), torch.tensor([bits, len(values)], dtype=torch.int32))


def _positions(index: torch.Tensor | None, numel: int) -> torch.Tensor:
    """Where the kept entries are: int32 indices, or a bitmask (numel/8 bytes) when that is smaller."""
    if index is None:
        return torch.zeros(0, dtype=torch.int32)
    if numel / 8 < 4 * index.numel():
        mask = torch.zeros(numel, dtype=torch.bool)
        mask[index.cpu()] = True
        return pack_mask(mask)
    return index.to(torch.int32)


def decode(tensors: tuple[torch.Tensor, ...]) -> torch.Tensor:
    shape, index = tuple(int(s) for s in tensors[0]), tensors[1]
    if index.dtype == torch.uint8:
        index = unpack_mask(index, math.prod(shape)).nonzero()[:, 0]
    if len(tensors) == 3:
        values = tensors[2]
    else:
        packed, (lo, hi), (bits, count) = tensors[2], tensors[3], tensors[4].tolist()
        q = torch.from_numpy(_unpack_bits(packed.cpu().numpy(), bits, count)).float().to(lo.device)
        values = lo + q / (2**bits - 1) * (hi - lo)
    if index.numel() == 0:
        return values.reshape(shape)
    out = torch.zeros(math.prod(shape), dtype=values.dtype, device=values.device)  # where the message was handed over
    out[index.to(values.device).long()] = values
    return out.reshape(shape)


def gaussian_projection(d_in: int, d_out: int, seed: int) -> torch.Tensor:
    """P (d_in, d_out) with N(0, 1/d_out) entries from a seed every peer shares: Z = X P keeps norms
    on average, and X cannot be read back from Z without P, and with P only up to its null space when d_out < d_in."""
    gen = torch_generator(seed, "projection", d_in, d_out)
    return torch.randn(d_in, d_out, generator=gen) / math.sqrt(d_out)


def project_dataset(data, d_out: int, seed: int) -> None:
    """Replace train and test inputs by their projections (the model's input size becomes d_out)."""
    d_in = data.train_x[0].numel()
    P = gaussian_projection(d_in, d_out, seed).to(data.train_x.device)
    data.train_x = data.train_x.reshape(len(data.train_x), -1) @ P
    data.test_x = data.test_x.reshape(len(data.test_x), -1) @ P
    data.pixel_levels = None
