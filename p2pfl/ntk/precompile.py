"""Compile the split integrator's loop (numba) into its on-disk cache, so that the first NTK run after
installing does not spend about a minute compiling, and MPI ranks that start together do not each
compile it. `make install` runs it; `python -m p2pfl.ntk.precompile`."""

from __future__ import annotations

import time

import numpy as np
import torch

from p2pfl.ntk.evolution import evolve_ce


def loop_is_cached() -> bool:
    """Whether numba's cache holds the integrator loop compiled for this machine's processor (else the
    first evolution compiles it, for a minute or two). Reads numba's cache index; where its layout
    is not the one known here, says True rather than guess."""
    try:
        from p2pfl.ntk import split_loop  # numba: asked only where a CPU evolution is coming

        loop = split_loop.left_sums
        magic = loop.targetctx.codegen().magic_tuple()
        return any(key[1] == magic for key in loop._cache._cache_file._load_index())
    except Exception:  # noqa: BLE001 - a private numba layout: never the reason a run fails
        return True


def precompile() -> float:
    """Run the split and deflated evolutions once on a small random neighbourhood large enough for the
    lazy remainder (over 96 samples): that compiles (or loads) every signature the runs use. Returns
    the seconds it took."""
    start = time.perf_counter()
    rng = np.random.default_rng(0)
    n = 120
    X = rng.standard_normal((n, 30)).astype(np.float32)
    H = torch.from_numpy(X @ X.T)
    f0 = torch.from_numpy(0.1 * rng.standard_normal((n, 10)).astype(np.float32))
    Y = torch.nn.functional.one_hot(torch.from_numpy(rng.integers(0, 10, n)), 10).float()
    for mode in ("split", "deflated"):
        evolve_ce(H, f0, Y, 0.01, [5, 40], mode)
    return time.perf_counter() - start


if __name__ == "__main__":
    print(f"NTK loop compiled or loaded from numba's cache in {precompile():.1f} s")
