"""Compile the split integrator's loop (numba) into its on-disk cache, so that the first NTK run after
installing does not spend about a minute compiling, and MPI ranks that start together do not each
compile it. `make install` runs it; `python -m p2pfl.ntk.precompile`.

It also records what the loop computes on three probe kernels, and whether this process compiled it: a
later process, loading the loop from the cache, must compute the same bits (they differed while the loop
called its helpers as separate functions; tests/test_split_loop.py checks it)."""

from __future__ import annotations

import time
from pathlib import Path

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


RECORD = Path(__file__).with_name("__pycache__") / "precompiled_probes.npz"
# (samples, stiffness): the split integrator's steps of 2 units, of 1.5, and a t between its units
PROBES = ((200, 3.5), (300, 6.0), (150, 5.5))


def stiff_kernel(n: int, seed: int, top: float = 3.5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A kernel with a stiff top and a slow tail, as NTK kernels have ((eta/N) lambda ~ top, top / 2.3, ...
    1e-3), with random outputs and labels: H, f0, Y."""
    rng = np.random.default_rng(seed)
    Q = np.linalg.qr(rng.standard_normal((n, n)))[0]
    lam = top * n / 0.01 * np.arange(1, n + 1, dtype=np.float64) ** -1.2
    H = torch.tensor((Q * lam) @ Q.T, dtype=torch.float32)
    f0 = torch.tensor(rng.standard_normal((n, 10)) * 0.3, dtype=torch.float32)
    Y = torch.nn.functional.one_hot(torch.tensor(rng.integers(0, 10, n)), 10).float()
    return H, f0, Y


def probe_bits() -> np.ndarray:
    """The split and deflated evolutions of the probe kernels, residual sums and outputs, in one array."""
    out = []
    for n, top in PROBES:
        H, f0, Y = stiff_kernel(n, n, top)
        for mode in ("split", "deflated"):
            e = evolve_ce(H, f0, Y, 0.01, [50, 101, 200, 400, 800], mode)
            out += [e.residual_sums.numpy().ravel(), e.outputs.numpy().ravel()]
    return np.concatenate(out)


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


def record_probes(path: Path = RECORD) -> None:
    """Save the probes' evolutions where this process compiled the loop (the cache had none before), or
    where nothing is recorded yet (then as not compiled): a later precompile that loads the loop leaves a
    compiled record alone (the device check's runs one while the tests run)."""
    compiled = not loop_is_cached()
    seconds = precompile()
    if compiled or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, bits=probe_bits(), compiled=compiled)
    print(f"NTK loop {'compiled' if compiled else 'loaded from numba cache'} in {seconds:.1f} s")


if __name__ == "__main__":
    record_probes()
