"""Jacobian compression (NTK-DFL appendix D.2, CP-NTK-FL): top-k sparsification, b-bit quantization of
what is kept (really bit-packed, so the byte count is honest), and a shared-seed Gaussian projection
of the inputs that shrinks the model's input size."""

from __future__ import annotations

import math

import torch

from p2pfl.gossip.bitpack import pack_bits, pack_mask, unpack_bits, unpack_mask
from p2pfl.seeding import torch_generator


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
    packed = torch.from_numpy(pack_bits(q, bits))
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
        q = torch.from_numpy(unpack_bits(packed.cpu().numpy(), bits, count)).float().to(lo.device)
        values = lo + q / (2**bits - 1) * (hi - lo)
    if index.numel() == 0:
        return values.reshape(shape)
    out = torch.zeros(math.prod(shape), dtype=values.dtype, device=values.device)  # where the message was handed over
    out[index.to(values.device).long()] = values
    return out.reshape(shape)


def gaussian_projection(d_in: int, d_out: int, seed: int, standard: bool = False) -> torch.Tensor:
    """P (d_in, d_out) with N(0, 1/d_out) entries from a seed every peer shares: Z = X P keeps norms
    on average, and X cannot be read back from Z without P, and with P only up to its null space when d_out < d_in.
    standard: N(0, 1) entries, as the NTK-FL paper writes it."""
    gen = torch_generator(seed, "projection", d_in, d_out)
    draw = torch.randn(d_in, d_out, generator=gen)
    return draw if standard else draw / math.sqrt(d_out)


def project_dataset(data, d_out: int, seed: int, standard: bool = False) -> None:
    """Replace train and test inputs by their projections (the model's input size becomes d_out)."""
    d_in = data.train_x[0].numel()
    P = gaussian_projection(d_in, d_out, seed, standard).to(data.train_x.device)
    data.train_x = data.train_x.reshape(len(data.train_x), -1) @ P
    data.test_x = data.test_x.reshape(len(data.test_x), -1) @ P
    data.pixel_levels = None
