"""The CE evolution of many neighbourhoods at once, as batched products on the run's device.

The numba loop (p2pfl.ntk.split_loop) integrates one kernel per CPU thread. On a GPU a rank's kernels
are one batch instead, and each stage is a few batched products:

- kernels (B, N, N) are padded with zeros to the largest N: a padded sample neither moves nor moves
  another, and its rows are dropped at the end;
- each kernel's step plan is the split method's (evolution.step_plan: quarter RK3 steps in the 16-unit
  transient, then SSPRK(4,3) steps of 2, 1.5 or 1/k units by its stiffness, the whole units inside a
  step by cubic Hermite interpolation), and kernels are grouped by plan, so no kernel's steps depend on
  what shares its batch;
- as in 'split', the kernel is H = V M V^T + H2 with V its top-16 subspace (a few batched products of
  subspace iteration; a batched eigh of 300 kernels of 1,200 took 3.8 s on an H100): the stiff rank-16
  part is applied exactly at every stage, the slow remainder H2 exactly at every whole unit of the
  transient and at the start of every step after it (the numba loop spaces these by an error
  estimate, up to 64 units apart), and by its polynomial through the last exact values between (the
  line in the transient, the quadratic after it, as the numba loop). The remainder product is the one
  that reads the whole kernel, about half a millisecond for 300 kernels of 1,200 on a GPU's
  bandwidth; a stage of the rank-16 part is thin.
- a kernel whose remainder is not slow (the 16th eigenvalue's rate above SPLIT_SLOW), or of at most
  FULL_SPLIT samples, takes the whole kernel at every stage instead, as 'split' falls back to an
  accurate solver there.

Nothing inside the loop waits for the device: the step plans are read once, before it.
"""

from __future__ import annotations

from fractions import Fraction

import torch

from p2pfl.errors import DivergenceError
from p2pfl.ntk import numerics
from p2pfl.ntk.evolution import (
    FULL_SPLIT,
    SPLIT_RANK,
    SPLIT_SLOW,
    SPLIT_WARMUP,
    Evolution,
    check_stiffness,
    step_plan,
)
from p2pfl.ntk.numerics import BatchedRows, top_subspace

# the step written once (p2pfl.ntk.numerics), on whole tensors
_ssprk43 = numerics.ssprk43_with(
    lambda u, t, slope: slope(u, t), lambda j, f, u, k, h, _: numerics.ssprk43_stage(j, f, u, k, h)
)


def evolve_ce_batched(
    kernels: list[torch.Tensor],
    f0s: list[torch.Tensor],
    targets: list[torch.Tensor],
    eta: float,
    taus: list[int],
    euler: bool = False,
) -> list[Evolution]:
    """evolution.evolve_ce for each (H, f0, Y), all on their device at once: 'split' (the accurate ODE)
    or, with euler, unit Euler steps ('euler' and 'deflated' compute those)."""
    sizes = [len(H) for H in kernels]
    H = _padded([H.float() for H in kernels], square=True)
    f, Y = _padded([f.float() for f in f0s]), _padded([y.float() for y in targets])
    sums, outputs, rates = evolve_padded(H, f, Y, sizes, eta, taus, euler)
    return [
        Evolution(list(taus), sums[:, i, :n].to(like.dtype), outputs[:, i, :n].to(like.dtype), rate)
        for i, (n, like, rate) in enumerate(zip(sizes, f0s, rates))
    ]


def evolve_padded(
    H: torch.Tensor, f: torch.Tensor, Y: torch.Tensor, sizes: list[int], eta: float, taus: list[int], euler: bool
) -> tuple[torch.Tensor, torch.Tensor, list[float]]:
    """The evolutions of kernels H (B, N, N) padded with zeros (consumed: scaled in place), outputs f and
    one-hot targets Y (B, N, C), each of its own size: the left sums and outputs (T, B, N, C), NaN for a
    kernel too stiff to integrate or a diverged model, and each one's scale eta/N.

    One integration loop for all: every kernel takes the step plan of the stiffest (its steps are the
    shortest, so the others are integrated at least as accurately as on their own plan), and a kernel
    whose remainder is not slow takes its whole kernel at every stage beside the split ones."""
    rates = [float(eta) / n for n in sizes]
    H.mul_(torch.tensor([-r for r in rates], device=H.device)[:, None, None])  # -(eta/N) H: the slope's kernel
    finite = torch.isfinite(H).all(2).all(1) & torch.isfinite(f).all(2).all(1)
    H.masked_fill_(~finite[:, None, None], 0.0)  # a diverged model's kernel: zeros here (NaN below)
    V = top_subspace(H, SPLIT_RANK, BatchedRows, sizes).transpose(1, 2)
    M = V.transpose(1, 2) @ H @ V
    ritz = torch.linalg.eigvalsh(-(M + M.transpose(1, 2)) / 2).cpu()  # of (eta/N) H, ascending
    stiffness, split = [], []
    for n, values, ok in zip(sizes, ritz.tolist(), finite.tolist()):
        stiff = values[-1] if ok else None
        try:
            if stiff is not None and not euler:
                check_stiffness(stiff)
        except DivergenceError:  # too stiff to integrate: NaN, as evolution.evolve gives
            stiff = None
        stiffness.append(stiff)
        split.append(not euler and n > FULL_SPLIT and values[0] <= SPLIT_SLOW)
    live = [i for i, s in enumerate(stiffness) if s is not None]
    sums = f.new_full((len(taus), *f.shape), float("nan"))
    outputs = sums.clone()
    if not live:
        return sums, outputs, rates
    warm_steps, h = step_plan(max(stiffness[i] for i in live), euler)
    index = None if len(live) == len(sizes) else torch.tensor(live, device=H.device)

    def rows(t: torch.Tensor) -> torch.Tensor:
        return t if index is None else t.index_select(0, index)

    whole = [j for j, i in enumerate(live) if not split[i]]
    top = None if len(whole) == len(live) else (rows(V), rows(M), whole)
    live_sums, live_outputs = _integrate(_Slope(rows(H), rows(Y), top), rows(f), taus, warm_steps, h, euler)
    if index is None:
        return live_sums, live_outputs, rates
    sums.index_copy_(1, index, live_sums)
    outputs.index_copy_(1, index, live_outputs)
    return sums, outputs, rates


class _Slope:
    """df/ds at f and time t: scaled (softmax(f) - Y) with scaled = -(eta/N) H, whole (top None), or
    split as V M V^T g exactly plus the remainder H2 g from its polynomial (see exact). top = (V, M,
    whole): the kernels listed in whole (their remainder is not slow) take their whole kernel at every
    stage instead, beside the split ones in the same loop."""

    def __init__(self, scaled: torch.Tensor, Y: torch.Tensor, top: tuple | None):
        self.Y, self.whole = Y, None
        if top is None:
            self.kernel, self.V, self.VM = scaled, None, None
            return
        V, M, whole = top
        if whole:
            self.whole = torch.tensor(whole, device=scaled.device)
            self.whole_kernel = scaled.index_select(0, self.whole)
            V = V.index_fill(0, self.whole, 0.0)  # no split part: their remainder is their whole kernel...
        self.V, self.VM = V, V @ M
        self.kernel = scaled.baddbmm_(self.VM, V.transpose(1, 2), alpha=-1.0)  # the remainder, in place
        if whole:
            self.kernel.index_fill_(0, self.whole, 0.0)  # ...applied exactly at every stage, not from the polynomial
        self.known: list[tuple[float, torch.Tensor]] = []  # the last three exact (t, H2 g)

    def residual(self, f: torch.Tensor) -> torch.Tensor:
        return torch.softmax(f, -1).sub_(self.Y)

    def exact(self, t: float, g: torch.Tensor) -> None:
        """The remainder's exact product at t (g = residual there), and its polynomial's new terms."""
        if self.V is None:
            return
        self.known = [*self.known[-2:], (t, torch.bmm(self.kernel, g))]
        (t2, q2), self.slope, self.curvature = self.known[-1], None, None
        if len(self.known) >= 2:
            t1, q1 = self.known[-2]
            self.slope = torch.sub(q2, q1).mul_(1 / (t2 - t1))
            if len(self.known) == 3 and t > SPLIT_WARMUP:  # the line in the transient, as the numba loop
                t0, q0 = self.known[0]
                earlier = torch.sub(q1, q0)
                self.curvature = torch.add(self.slope, earlier, alpha=-1 / (t1 - t0)).mul_(1 / (t2 - t0))

    def remainder(self, t: float) -> torch.Tensor:
        """H2 g at t from its polynomial through the last exact products (read, not changed, by the caller)."""
        (t2, q2), t1 = self.known[-1], self.known[-2][0] if len(self.known) > 1 else None
        out = q2 if self.slope is None else torch.add(q2, self.slope, alpha=t - t2)
        return out if self.curvature is None else out.add_(self.curvature, alpha=(t - t2) * (t - t1))

    def __call__(self, f: torch.Tensor, t: float, g: torch.Tensor | None = None) -> torch.Tensor:
        g = self.residual(f) if g is None else g
        if self.V is None:
            return torch.bmm(self.kernel, g)
        out = torch.baddbmm(self.remainder(t), self.VM, self.V.transpose(1, 2) @ g)
        if self.whole is not None:
            out.index_add_(0, self.whole, torch.bmm(self.whole_kernel, g.index_select(0, self.whole)))
        return out


def _padded(tensors: list[torch.Tensor], square: bool = False) -> torch.Tensor:
    n = max(len(t) for t in tensors)
    out = tensors[0].new_zeros(len(tensors), n, n if square else tensors[0].shape[1])
    for i, t in enumerate(tensors):
        out[i, : len(t), : t.shape[1]] = t
    return out


def _integrate(
    slope: _Slope, f: torch.Tensor, taus: list[int], warm_steps: int, h: float, euler: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The left sums S_t and outputs f_t (T, B, N, C) of df/ds = slope(f, s): unit Euler steps (euler),
    else RK3 substeps of 1/warm_steps for the first SPLIT_WARMUP units and SSPRK(4,3) steps of h after
    them (shorter at the end, to land on the last candidate). The remainder's exact products: at every
    whole unit of the transient, and at the start of every step after it."""
    t_max, wanted = max(taus), {t: i for i, t in enumerate(taus)}
    sums = f.new_empty((len(taus),) + f.shape)
    outputs = torch.empty_like(sums)
    running = torch.zeros_like(f)
    g = slope.residual(f)

    def reached(unit, fu):  # f at a whole unit: record it, then add its residual to the running sum
        nonlocal running
        if unit in wanted:
            sums[wanted[unit]], outputs[wanted[unit]] = running, fu
        if unit < t_max:
            running = running + slope.residual(fu)

    reached(0, f)
    t = Fraction(0)  # t and the steps as exact fractions (1.5, 1/3), so the whole units are found exactly
    while t < t_max:
        slope.exact(float(t), g)
        if euler:
            f = f + slope(f, float(t), g)
            t += 1
            reached(int(t), f)
        elif t < SPLIT_WARMUP:
            sub = 1.0 / warm_steps
            for i in range(warm_steps):  # Heun's third-order Runge-Kutta
                u = float(t) + i * sub
                a = slope(f, u, g if i == 0 else None)
                b = slope(torch.add(f, a, alpha=sub / 3), u + sub / 3)
                c = slope(torch.add(f, b, alpha=2 * sub / 3), u + 2 * sub / 3)
                f = torch.add(f, a, alpha=sub / 4).add_(c, alpha=3 * sub / 4)
            t += 1
            reached(int(t), f)
        else:
            step = min(Fraction(h).limit_denominator(64), t_max - t)
            start, length = float(t), float(step)
            k1 = slope(f, start, g)
            end = _ssprk43(f, k1, start, length, slope)
            k_end = slope(end, start + length)
            for unit in range(int(t) + 1, int(t + step) + 1):
                theta = (unit - t) / step
                reached(unit, end if theta == 1 else numerics.hermite(f, k1, end, k_end, float(theta), length))
            t, f = t + step, end
        g = slope.residual(f)
    return sums, outputs
