"""Every random choice draws from a generator keyed by (seed, purpose, indices...).

Keying by purpose and peer instead of drawing from a global stream is what makes a run's numbers
independent of how peers are spread over MPI ranks.
"""

import functools
import hashlib

import numpy as np
import torch


def derive_seed(seed: int, purpose: str, *indices: int) -> int:
    """A 63-bit seed that depends only on its arguments."""
    key = repr((int(seed), str(purpose)) + tuple(int(i) for i in indices)).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") & (2**63 - 1)


def uniform_draw(seed: int, purpose: str, *indices: int) -> float:
    """A uniform draw in [0, 1) that depends only on its arguments (a simulated fault, a peer's speed)."""
    return derive_seed(seed, purpose, *indices) * 2.0**-63


def graph_seeds(seed: int):
    """The seed of the graph for each key (a round, or 0 for a static graph), for topologies.TopologySchedule."""
    return functools.partial(derive_seed, seed, "topology")


def torch_generator(seed: int, purpose: str, *indices: int) -> torch.Generator:
    gen = torch.Generator()
    gen.manual_seed(derive_seed(seed, purpose, *indices))
    return gen


def numpy_rng(seed: int, purpose: str, *indices: int) -> np.random.Generator:
    return np.random.default_rng(derive_seed(seed, purpose, *indices))


# Counter-based draws on any device. A generator per peer per step costs the CPU a call per peer and a
# copy to the device per step (88 ms a step for the dropout noise of 300 peers). Instead each peer gets
# one 32-bit key per round (derive_seed), and a draw is a hash of (key, counters...) computed elementwise
# where the tensors live: int32 arithmetic (products wrap mod 2^32, shifts masked to be logical), so the
# CPU and a GPU give the same bits, on any layout of the peers.
_MUL1, _MUL2 = 0x7FEB352D, 0x846CA68B - (1 << 32)  # Wellons' lowbias32 constants, as int32


def _mix32(h: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finalizer, in place on an int32 tensor: each input bit moves about half the
    output bits."""
    h.bitwise_xor_((h >> 16) & 0xFFFF)
    h.mul_(_MUL1)
    h.bitwise_xor_((h >> 15) & 0x1FFFF)
    h.mul_(_MUL2)
    return h.bitwise_xor_((h >> 16) & 0xFFFF)


def _int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def peer_keys(
    seed: int, purpose: str, round_index: int | list[int], peers: list[int], device: torch.device | str = "cpu"
) -> torch.Tensor:
    """(len(peers),) int32 keys on device, one per peer: (seed, purpose, round, peer)'s. round_index may be
    one per peer (an asynchronous run's peers are at steps of their own)."""
    rounds = round_index if isinstance(round_index, list) else [round_index] * len(peers)
    return torch.tensor(
        [_int32(derive_seed(seed, purpose, r, p)) for r, p in zip(rounds, peers)], dtype=torch.int32
    ).to(device)


def keyed_bits(keys: torch.Tensor, *counters: int | torch.Tensor) -> torch.Tensor:
    """32 random bits (int32) for each key and counter value, broadcast together: a function of its
    arguments alone, the same on every device."""
    h = keys.clone()
    for c in counters:
        h = _mix32(h ^ (c.to(torch.int32) if isinstance(c, torch.Tensor) else _int32(int(c))))
    return h


def keyed_uniform(keys: torch.Tensor, n: int, *counters: int) -> torch.Tensor:
    """(len(keys), n) float32 uniform in [0, 1) on keys' device: row i from keys[i] and the counters."""
    prefix = keyed_bits(keys[:, None], *counters)  # (L, 1): the per-element work is one mix
    bits = keyed_bits(prefix, torch.arange(n, dtype=torch.int32, device=keys.device)[None])
    return ((bits >> 8) & 0xFFFFFF).to(torch.float32).mul_(1.0 / (1 << 24))  # 24 bits: exact in float32


def keyed_orders(keys: torch.Tensor, lengths: torch.Tensor, width: int, *counters: int) -> torch.Tensor:
    """(len(keys), width) positions: row i a random permutation of range(lengths[i]), keyed by keys[i]
    and the counters, followed by lengths[i]..width-1 in order. Sorted by (hash, position), so ties break
    the same way everywhere."""
    prefix = keyed_bits(keys[:, None], *counters)
    position = torch.arange(width, device=keys.device)
    bits = keyed_bits(prefix, position[None].to(torch.int32)).long() & 0xFFFFFFFF
    rank = torch.where(position[None] < lengths[:, None], bits << 24 | position[None], (1 << 57) + position[None])
    return torch.argsort(rank, dim=1)
