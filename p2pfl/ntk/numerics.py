"""The numerical steps of the CE kernel evolution, each written once for either device.

The CPU runs them inside a compiled loop (numba, p2pfl.ntk.split_loop: one kernel per thread, without
the GIL); a GPU runs them on a batch of padded kernels as tensor products (p2pfl.ntk.batched_evolution).
The same Python source serves both: the elementwise formulas (hermite, ssprk43_stage) are called by
the compiled loop on each entry, with the very arithmetic it had inline, and by torch on whole
tensors; the step's driver and subspace iteration take the device's operations as arguments. So the
CPU's tests run the GPU's arithmetic, and a fix reaches both.

- `hermite`: the cubic through two states and their slopes, at a fraction of a step;
- `ssprk43_stage`, `ssprk43_with`: one step of the four-stage, third-order SSP Runge-Kutta method
  (Spiteri and Ruuth), its stages' times t, t + h/2, t + h, t + h/2, for a slope of the caller's;
- `top_subspace`: subspace iteration from fixed start vectors, the device's products and
  orthonormalization passed in (split_loop.CompiledRows on the CPU, BatchedRows on a GPU).

Scalars are float32 (np.float32), so that numba's arithmetic stays in float32 as the arrays are and
torch takes them as plain numbers.
"""

from __future__ import annotations

import numpy as np

SUBSPACE_ITERATIONS = 6


def hermite(y0, m0, y1, m1, theta, h):
    """The cubic through y0 and y1 with slopes m0 and m1 at the ends of a step of length h, at the
    fraction theta of the step. Elementwise: the compiled loop calls it on each entry, torch on whole
    tensors (a new one)."""
    t2, t3 = theta * theta, theta * theta * theta
    a, b = np.float32(2 * t3 - 3 * t2 + 1), np.float32(h * (t3 - 2 * t2 + theta))
    c, d = np.float32(3 * t2 - 2 * t3), np.float32(h * (t3 - t2))
    return a * y0 + b * m0 + c * y1 + d * m1


SSPRK43_TIMES = (0.5, 1.0, 0.5)  # where the slopes of stages 2 to 4 are taken, in steps from its start


def ssprk43_stage(j, f, u, k, h):
    """Stage j (0 to 3) of one SSPRK(4,3) step of length h from f: the next stage from the previous one u
    and its slope k (for j = 0, u is f and k = F(f)). Elementwise, as hermite:

        u1 = f + h/2 F(f);  u2 = u1 + h/2 F(u1);  u3 = (2 f + u2) / 3 + h/6 F(u2);  out = u3 + h/2 F(u3)
    """
    half, sixth, third = np.float32(h / 2), np.float32(h / 6), np.float32(1 / 3)
    if j == 0:
        return f + half * k
    if j == 2:
        return (f + f + u) * third + sixth * k
    return u + half * k


def ssprk43_with(slope, stage):
    """One step of the four-stage, third-order SSP Runge-Kutta method (Spiteri and Ruuth), whose stability
    interval on the negative real axis is 5.15 against RK3's 2.51, for the caller's slope(u, time,
    state) and stage(j, f, u, k, h, state) (ssprk43_stage applied where the caller keeps its arrays;
    the compiled loop's buffers, or a batch's _Slope, travel as state)."""

    def ssprk43(f, k1, t, h, state):
        """f after one step of length h from time t, given k1 = F(f) at t."""
        u = stage(0, f, f, k1, h, state)
        for j in range(1, 4):
            u = stage(j, f, u, slope(u, t + h * SSPRK43_TIMES[j - 1], state), h, state)
        return u

    return ssprk43


def start_rows(rank: int, sizes: list[int], seed: int = 0) -> np.ndarray:
    """Subspace iteration's start vectors (len(sizes), rank, max size), float32: each kernel's own, drawn
    for its own size from a fixed seed (a kernel starts alike alone or in a padded batch), zero on
    padding."""
    own = {n: np.random.default_rng(seed).standard_normal((rank, n)).astype(np.float32) for n in set(sizes)}
    out = np.zeros((len(sizes), rank, max(sizes)), np.float32)
    for i, n in enumerate(sizes):
        out[i, :, :n] = own[n]
    return out


def top_subspace(
    H, rank: int, ops, sizes: list[int] | None = None, iterations: int = SUBSPACE_ITERATIONS, seed: int = 0
):
    """Rows (B, rank, N) that span a space close to each symmetric kernel's top (largest-magnitude)
    eigenvectors: `iterations` of Qt <- orthonormal rows of Qt H from start_rows. H: (B, N, N) padded with
    zeros to N (sizes: each kernel's own; None: all N); ops: the device's `times(Qt, H)` and
    `orthonormal_rows(Qt)`. A kernel of at most `rank` samples has no rank-`rank` subspace: it takes its
    whole coordinate basis, whose Ritz values are its eigenvalues (and zeros)."""
    B, N = len(H), H.shape[-1]
    sizes = list(sizes) if sizes is not None else [N] * B
    rank = min(rank, N)
    Qt = ops.array(start_rows(rank, sizes, seed), like=H)
    for _ in range(iterations):
        Qt = ops.orthonormal_rows(ops.times(Qt, H))
    small = [i for i, n in enumerate(sizes) if n <= rank]
    if small:
        Qt = ops.coordinate_rows(Qt, small, sizes)
    return Qt


class BatchedRows:
    """top_subspace's operations as batched tensor products (a GPU; the CPU's tests run them too):
    orthonormalized by Cholesky QR twice (a batched Householder QR is slow on a GPU); nothing waits for
    the device."""

    @staticmethod
    def array(start: np.ndarray, like):
        import torch

        return torch.from_numpy(start).to(like.device)

    @staticmethod
    def times(Qt, H):
        import torch

        return torch.bmm(Qt, H)  # (H Q)^T = Q^T H for a symmetric H

    @staticmethod
    def orthonormal_rows(Qt):
        return _cholesky_rows(_cholesky_rows(Qt))

    @staticmethod
    def coordinate_rows(Qt, small, sizes):
        import torch

        B, rank, N = Qt.shape
        whole = torch.eye(rank, N, device=Qt.device).expand(B, rank, N)
        coords = torch.arange(N, device=Qt.device)[None, :]
        n = torch.tensor(sizes, device=Qt.device)[:, None, None]
        own = torch.where(coords < n, whole, torch.zeros((), device=Qt.device))  # a padded coordinate is no axis
        pick = torch.zeros(B, 1, 1, dtype=torch.bool, device=Qt.device)
        pick[small] = True
        return torch.where(pick, own, Qt)


def _cholesky_rows(Qt):
    """R^-T Qt with R^T R = Qt Qt^T. The Gram is formed in float64 (in float32 its rounding makes it
    indefinite where Qt is near rank-deficient) and shifted by 1e-12 of its largest diagonal entry, so
    that the factorization exists for any Qt; cholesky_ex, which never waits for the device to report."""
    import torch

    Q64 = Qt.double()
    G = Q64 @ Q64.transpose(1, 2)
    shift = 1e-12 * G.diagonal(dim1=1, dim2=2).amax(-1).clamp(min=torch.finfo(torch.float64).tiny)
    G.diagonal(dim1=1, dim2=2).add_(shift[:, None])
    L = torch.linalg.cholesky_ex(G).L
    return torch.linalg.solve_triangular(L, Q64, upper=False).float()
