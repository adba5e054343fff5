"""The CE evolution of many neighbourhoods at once, as batched products on the run's device.

The numba loop (p2pfl.ntk.split_loop) integrates one kernel per CPU thread. On a GPU a rank's kernels
are one batch instead, and the loop is a few batched products per stage:

- kernels (B, N, N) are padded with zeros to the largest N: a padded sample neither moves nor moves
  another, and its rows are dropped at the end;
- each kernel's step plan is the split method's (evolution.step_plan: quarter RK3 steps in the 16-unit
  transient, then SSPRK(4,3) steps of 2, 1.5 or 1/k units by its stiffness, the whole units inside a
  step by cubic Hermite interpolation), and kernels are grouped by plan, so no kernel's steps depend on
  what shares its batch;
- every stage applies the whole kernel: no remainder is extrapolated, so this is at least as close to
  the ODE as 'split' (tested against the tight solution), at one full product per stage, which is what
  a GPU's bandwidth is for (the numba loop avoids it because a CPU's is not).

Nothing inside the loop waits for the device: the step plans are read once, before it.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import torch

from p2pfl.ntk.evolution import SPLIT_WARMUP, Evolution, step_plan

STIFFNESS_RANK, STIFFNESS_ITERATIONS = 4, 8  # subspace iteration for each kernel's largest eigenvalue


def evolve_ce_batched(kernels: list[torch.Tensor], f0s: list[torch.Tensor], targets: list[torch.Tensor],
                      eta: float, taus: list[int], euler: bool = False) -> list[Evolution]:
    """evolution.evolve_ce for each (H, f0, Y), all on their device at once: 'split' (the accurate ODE)
    or, with euler, unit Euler steps ('euler' and 'deflated' compute those)."""
    sizes = [len(H) for H in kernels]
    rates = [float(eta) / n for n in sizes]
    H = _padded([H.float() for H in kernels], square=True)
    stiffness = [r * lam for r, lam in zip(rates, largest_eigenvalues(H))]
    plans = [step_plan(x, euler) for x in stiffness]
    f, Y = _padded([f.float() for f in f0s]), _padded([y.float() for y in targets])
    results: list[Evolution | None] = [None] * len(kernels)
    for plan in sorted(set(plans)):
        rows = [i for i, p in enumerate(plans) if p == plan]
        index = torch.tensor(rows, device=H.device)
        scaled = H.index_select(0, index).mul_(torch.tensor([-rates[i] for i in rows], device=H.device)[:, None, None])
        sums, outputs = _integrate(scaled, f.index_select(0, index), Y.index_select(0, index), taus, *plan, euler)
        for j, i in enumerate(rows):
            n, like = sizes[i], f0s[i]
            results[i] = Evolution(list(taus), sums[:, j, :n].to(like.dtype), outputs[:, j, :n].to(like.dtype), rates[i])
    return results


def largest_eigenvalues(H: torch.Tensor) -> list[float]:
    """The largest eigenvalue of each symmetric (N, N) in H (B, N, N), by a few batched steps of subspace
    iteration and the Ritz values of the small projected matrices. The start vectors are numpy's, of a
    fixed seed, row by row: a kernel's first n rows are the same whatever N the batch is padded to."""
    B, N, _ = H.shape
    start = np.random.default_rng(0).standard_normal((N, STIFFNESS_RANK)).astype(np.float32)
    Q = torch.from_numpy(start).to(H.device).expand(B, N, STIFFNESS_RANK)
    for _ in range(STIFFNESS_ITERATIONS):
        Q = torch.linalg.qr(torch.bmm(H, Q)).Q
    ritz = torch.linalg.eigvalsh(Q.transpose(1, 2) @ H @ Q)
    return ritz[:, -1].tolist()


def _padded(tensors: list[torch.Tensor], square: bool = False) -> torch.Tensor:
    n = max(len(t) for t in tensors)
    out = tensors[0].new_zeros(len(tensors), n, n if square else tensors[0].shape[1])
    for i, t in enumerate(tensors):
        out[i, :len(t), :t.shape[1]] = t
    return out


def _integrate(scaled: torch.Tensor, f: torch.Tensor, Y: torch.Tensor, taus: list[int], warm_steps: int,
               h: float, euler: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The left sums S_t and outputs f_t (T, B, N, C) of df/ds = scaled (softmax(f) - Y), scaled being
    -(eta/N) H: unit Euler steps (euler), else RK3 substeps of 1/warm_steps for the first SPLIT_WARMUP
    units and SSPRK(4,3) steps of h after them (shorter at the end, to land on the last candidate)."""
    t_max, wanted = max(taus), {t: i for i, t in enumerate(taus)}
    sums = f.new_empty((len(taus),) + f.shape)
    outputs = torch.empty_like(sums)
    running = torch.zeros_like(f)

    def residual(y):
        return torch.softmax(y, -1).sub_(Y)

    def slope(y):
        return torch.bmm(scaled, residual(y))

    def reached(unit, fu):  # f at a whole unit: record it, then add its residual to the running sum
        nonlocal running
        if unit in wanted:
            sums[wanted[unit]], outputs[wanted[unit]] = running, fu
        if unit < t_max:
            running = running + residual(fu)

    reached(0, f)
    t, k1 = 0, None
    while t < t_max:
        if euler:
            f = f + slope(f)
            t += 1
            reached(t, f)
        elif t < SPLIT_WARMUP:
            sub = 1.0 / warm_steps
            for _ in range(warm_steps):  # Heun's third-order Runge-Kutta
                a = slope(f)
                b = slope(f + (sub / 3) * a)
                c = slope(f + (2 * sub / 3) * b)
                f = f + (sub / 4) * a + (3 * sub / 4) * c
            t += 1
            reached(t, f)
        else:  # t and the steps as exact fractions (1.5, 1/3), so the whole units are found exactly
            step = min(Fraction(h).limit_denominator(64), t_max - t)
            k1 = slope(f) if k1 is None else k1
            end = _ssprk43(f, k1, float(step), slope)
            k_end = slope(end)
            for unit in range(int(t) + 1, int(t + step) + 1):
                theta = (unit - t) / step
                reached(unit, end if theta == 1 else _hermite(f, k1, end, k_end, float(theta), float(step)))
            t, f, k1 = t + step, end, k_end
    return sums, outputs


def _ssprk43(f, k1, h, slope):
    """One four-stage, third-order SSP Runge-Kutta step (Spiteri and Ruuth), given k1 = slope(f)."""
    u = f + (h / 2) * k1
    u = u + (h / 2) * slope(u)
    u = (2 * f + u) / 3 + (h / 6) * slope(u)
    return u + (h / 2) * slope(u)


def _hermite(y0, m0, y1, m1, theta: float, h: float):
    """The cubic through y0 and y1 with slopes m0 and m1 at the ends of a step of length h, at theta."""
    t2, t3 = theta * theta, theta ** 3
    return (2 * t3 - 3 * t2 + 1) * y0 + h * (t3 - 2 * t2 + theta) * m0 + (3 * t2 - 2 * t3) * y1 + h * (t3 - t2) * m1
