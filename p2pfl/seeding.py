"""Every random choice draws from a generator keyed by (seed, purpose, indices...).

Keying by purpose and peer instead of drawing from a global stream is what makes a run's numbers
independent of how peers are spread over MPI ranks.
"""
import hashlib

import numpy as np
import torch


def derive_seed(seed: int, purpose: str, *indices: int) -> int:
    """A 63-bit seed that depends only on its arguments."""
    key = repr((int(seed), str(purpose)) + tuple(int(i) for i in indices)).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") & (2**63 - 1)


def torch_generator(seed: int, purpose: str, *indices: int) -> torch.Generator:
    gen = torch.Generator()
    gen.manual_seed(derive_seed(seed, purpose, *indices))
    return gen


def numpy_rng(seed: int, purpose: str, *indices: int) -> np.random.Generator:
    return np.random.default_rng(derive_seed(seed, purpose, *indices))
