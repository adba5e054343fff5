"""The compiled pieces of the split CE integrator against plain numpy in float64, and the lazy remainder
against applying the whole kernel at every stage."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from p2pfl.ntk import split_loop
from p2pfl.ntk.evolution import _split_kernel, evolve_ce, tight_ce_sums
from p2pfl.ntk import precompile
from p2pfl.ntk.numerics import BatchedRows, start_rows, top_subspace
from p2pfl.ntk.precompile import stiff_kernel
from p2pfl.ntk.split_loop import CompiledRows


def test_softmax_minus_is_float32_accurate_over_the_clipped_range():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((10, 777)) * 20).astype(np.float32)
    x[0, :6] = [60, -60, 75, -75, 0, 1e-3]
    Y = np.zeros_like(x)
    Y[rng.integers(0, 10, 777), np.arange(777)] = 1
    out = np.empty_like(x)
    split_loop.softmax_minus(x, Y, out, np.empty(777, np.float32), np.empty(777, np.int32))
    e = np.exp(np.clip(x.astype(np.float64), -60, 60))
    assert np.abs(out - (e / e.sum(0) - Y)).max() < 3e-7


@pytest.mark.parametrize("rows,cols", [(10, 16), (9, 16), (10, 15), (3, 1), (1, 7)])
def test_projection_handles_odd_shapes(rows, cols):
    rng = np.random.default_rng(rows * cols)
    g, Vt = rng.random((rows, 101), dtype=np.float32), rng.random((cols, 101), dtype=np.float32)
    proj = np.empty((rows, cols), np.float32)
    split_loop.project(g, Vt, proj)
    assert np.allclose(proj, g.astype(np.float64) @ Vt.T, rtol=1e-5)


@pytest.mark.parametrize("n", [1, 7, 130])
def test_product_and_remainder_equal_numpy(n):
    rng = np.random.default_rng(n)
    H = rng.random((n, n), dtype=np.float32)
    H = (H + H.T).astype(np.float32)
    g = rng.random((10, n), dtype=np.float32)
    for rows in (10, 9, 4, 1):  # blocks of three rows and the rest; only the rows asked for are written
        out = np.full_like(g, -1.0)
        split_loop.product(g, H, out, rows)
        assert np.allclose(out[:rows], g[:rows].astype(np.float64) @ H, rtol=1e-5)
        assert (out[rows:] == -1.0).all()
    A, V = rng.random((n, 4), dtype=np.float32), rng.random((n, 4), dtype=np.float32)
    rem = np.empty_like(H)
    split_loop.remainder(H, np.ascontiguousarray(A.T), np.ascontiguousarray(V.T), np.float32(0.5), rem)
    assert np.allclose(rem, 0.5 * (H.astype(np.float64) - A.astype(np.float64) @ V.T), rtol=1e-5, atol=1e-5)


def test_split_kernel_reassembles_the_kernel():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((300, 40)).astype(np.float32)
    H = X @ X.T
    Vt, M, VMt, H2 = _split_kernel(H, 0.1)
    assert Vt.shape == (16, 300) and np.allclose(Vt @ Vt.T, np.eye(16), atol=1e-5)
    assert np.allclose(VMt, (Vt.T @ M).T, atol=1e-4 * np.abs(VMt).max())
    assert np.allclose(Vt.T @ M @ Vt + H2 / 0.1, H, atol=1e-3 * np.abs(H).max())
    Q = np.linalg.qr(rng.standard_normal((300, 300)))[0]
    H = ((Q * 0.5 ** np.arange(300.0)) @ Q.T).astype(np.float32)  # a well separated spectrum
    top = Q[:, :4]
    compiled = top_subspace(H[None], 4, CompiledRows)[0]  # the CPU's operations, one kernel
    batched = top_subspace(torch.from_numpy(np.stack([H, H])), 4, BatchedRows).numpy()  # a GPU's, on the CPU
    for rows in (compiled, *batched):
        assert np.allclose(rows @ rows.T, np.eye(4), atol=1e-5)
        assert np.linalg.svd(rows @ top, compute_uv=False).min() > 0.99


def test_a_kernel_starts_its_subspace_iteration_alike_alone_and_padded_in_a_batch():
    """Subspace iteration is written once (p2pfl.ntk.numerics) and starts each kernel from the vectors of
    its own size, so a GPU's padded batch iterates on the very vectors the CPU's loop starts from."""
    rows = start_rows(4, [30, 50])
    assert np.array_equal(rows[0, :, :30], start_rows(4, [30])[0]) and not rows[0, :, 30:].any()
    assert np.array_equal(rows[1], np.random.default_rng(0).standard_normal((4, 50)).astype(np.float32))


# the whole eigenbasis (up to 96 samples) and the lazy remainder; SSPRK(4,3) steps of two units
# (stiffness 3.5; an odd t ends on the unit between, interpolated), of one and a half (6: t ends on
# either unit inside the three) and of one (7, as trained neighbourhoods reach)
@pytest.mark.parametrize("n,top", [(80, 3.5), (200, 3.5), (80, 6.0), (200, 6.0), (80, 7.0), (200, 7.0)])
def test_split_and_deflated_follow_their_references(n, top):
    H, f0, Y = stiff_kernel(n, n, top)
    taus = [50, 101, 200]
    ref = tight_ce_sums(H, f0, Y, 0.01, taus).float()
    split = evolve_ce(H, f0, Y, 0.01, taus, "split")
    assert float(((split.residual_sums - ref).norm(dim=(1, 2)) / ref.norm(dim=(1, 2))).max()) < 1e-4
    outputs = evolve_ce(H, f0, Y, 0.01, taus, "adaptive").outputs  # f_t itself, within about 1e-5
    assert float(((split.outputs - outputs).norm(dim=(1, 2)) / outputs.norm(dim=(1, 2))).max()) < 1e-4
    euler = evolve_ce(H, f0, Y, 0.01, taus, "euler").residual_sums
    deflated = evolve_ce(H, f0, Y, 0.01, taus, "deflated").residual_sums
    assert float(((deflated - euler).norm(dim=(1, 2)) / euler.norm(dim=(1, 2))).max()) < 1e-4


# the probes' evolutions saved to a file by a process that loads the loop from numba's cache
_PROBES_TO = "import sys, numpy as np; from p2pfl.ntk.precompile import probe_bits; np.save(sys.argv[1], probe_bits())"


@pytest.mark.subprocess
def test_a_fresh_compile_and_a_cached_load_give_the_same_bits(tmp_path):
    """The first run after installing compiles the loop, later runs load it from the cache: the same
    numbers either way (they differed while the loop called its helpers as separate functions). `make
    install` compiled it and recorded the probes' bits; where it did not (the cache was already there),
    one process compiles into an empty cache and a second loads it."""
    recorded = np.load(precompile.RECORD) if precompile.RECORD.exists() else None
    if recorded is not None and bool(recorded["compiled"]) and precompile.loop_is_cached():
        compiled, env = recorded["bits"], dict(os.environ)
    else:
        env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
        subprocess.run([sys.executable, "-c", _PROBES_TO, str(tmp_path / "compiled")], env=env, check=True)
        assert any((tmp_path / "cache").rglob("*left_sums*.nbc"))  # the first process did compile and cache it
        compiled = np.load(tmp_path / "compiled.npy")
    subprocess.run([sys.executable, "-c", _PROBES_TO, str(tmp_path / "cached")], env=env, check=True)
    cached = np.load(tmp_path / "cached.npy")
    assert compiled.size > 0 and np.array_equal(compiled.view(np.uint32), cached.view(np.uint32))


def test_a_precompile_that_loads_the_loop_keeps_the_compiled_record(tmp_path):
    """The device check runs precompile while the tests run: loading the loop from the cache must not
    replace the record of the process that compiled it."""
    record = tmp_path / "probes.npz"
    precompile.record_probes(record)  # none yet: recorded, as loaded (this process compiled nothing)
    assert not bool(np.load(record)["compiled"]) and np.load(record)["bits"].size > 0
    np.savez(record, bits=np.zeros(3, np.float32), compiled=True)
    precompile.record_probes(record)
    assert bool(np.load(record)["compiled"]) and np.load(record)["bits"].size == 3


def test_the_compiled_loop_caches_only_the_numerics_it_was_written_with():
    """numba's cache of split_loop.py does not see numerics.py, whose steps it inlines: a changed
    numerics.py must change split_loop.NUMERICS_SHA256 (and so recompile), else the loop runs uncached."""
    import hashlib

    from p2pfl.ntk import numerics

    digest = hashlib.sha256(Path(numerics.__file__).read_bytes()).hexdigest()
    assert split_loop.NUMERICS_SHA256 == digest, f"set NUMERICS_SHA256 in p2pfl/ntk/split_loop.py to {digest}"
    assert split_loop.CACHE and split_loop.left_sums._cache.__class__.__name__ != "NullCache"
