"""Evolution of a neighbourhood's outputs under the NTK, for every candidate step count t at once.

With N samples, kernel H (N, N), outputs f0 and one-hot labels Y (N, C), learning rate eta:

- cross-entropy (the NTK-DFL/NTK-FL reference code): df/ds = -(eta/N) H (softmax(f) - Y), s in steps,
  solved as an ODE as the reference code does with its adaptive solver. 'split' (default) integrates it
  accurately and fast: third-order SSPRK(4,3) steps of two units (1.5, one, or shorter, for stiffer
  kernels; Heun's RK3 in quarter steps for the first 16, where the stiff transient lives), with the
  kernel split into its top-16 eigen-subspace, applied exactly at every stage, and the small
  remainder, applied exactly every few steps and extrapolated in between (the outputs corrected for
  the extrapolation's miss at each exact product). 'adaptive' integrates the ODE with error control
  (slower, a second opinion). 'euler' takes whole steps f_{s+1} = f_s - (eta/N) H (softmax(f_s) - Y),
  i.e. gradient descent on the linearized model, not the ODE; 'deflated' does those faster with the split.
- MSE, the reference code's closed form (one eigendecomposition): rate eta/(N C), f_s - Y = exp(-eta s H / (N C)) (f0 - Y).

Both return, per candidate t, the accumulated residual S_t, the evolved outputs f_t and the scale of the weight
update w_t = w0 - scale J^T S_t, as the reference code: for CE the left Riemann sum over whole steps,
sum_{s<t} (softmax(f_s) - Y), and scale eta/N; for MSE the right sum sum_{s=1..t} (f_s - Y) and scale eta/(N C).
(The paper's eq. 5 has an extra 1/d2 for CE that the reference code leaves out.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from p2pfl import stopping
from p2pfl.errors import DivergenceError
from p2pfl.ntk.numerics import top_subspace


@dataclass
class Evolution:
    taus: list[int]
    residual_sums: torch.Tensor  # (T, N, C): S_t
    outputs: torch.Tensor  # (T, N, C): f_t
    scale: float  # w_t = w0 - scale J^T S_t


def evolve_ce(
    H: torch.Tensor, f0: torch.Tensor, Y: torch.Tensor, eta: float, taus: list[int], method: str = "split"
) -> Evolution:
    """The CE trajectory at whole steps s = 0..max(taus), then the left Riemann sums at each t.

    Runs in numpy float32: for the thin (N, N) @ (N, C) products of this loop its BLAS is several times
    faster than torch's here, and the loop is the cost of an NTK-DFL round."""
    N, t_max = H.shape[0], max(taus)
    rate = float(eta) / N  # a Python float: a numpy float64 would promote the float32 loop to float64
    Hn, Yn = H.detach().cpu().numpy(), Y.detach().cpu().numpy()

    def rhs(f):
        return -rate * (_softmax_minus(f, Yn) @ Hn)

    # the loops run on transposed (C, N) arrays; H is symmetric, so H @ g is (g^T @ H)^T
    f_start, Yn = np.ascontiguousarray(f0.detach().cpu().numpy().T), np.ascontiguousarray(Yn.T)
    if not (np.isfinite(Hn).all() and np.isfinite(f_start).all()):
        raise DivergenceError("the kernel or the outputs hold NaN/inf")  # a diverged model's
    split = _split_sums(Hn, Yn, rate, f_start, taus, euler=False) if method == "split" else None
    if split is not None:
        sums, outputs = split
    elif method == "euler":
        sums, outputs = _euler_sums(Hn, Yn, rate, f_start, taus)
    elif method == "deflated":
        sums, outputs = _split_sums(Hn, Yn, rate, f_start, taus, euler=True)
    elif method in ("adaptive", "split"):  # split falls back here where it does not apply
        path = _adaptive_whole_steps(rhs, f_start, t_max)
        cum = np.cumsum([_softmax_minus(p, Yn) for p in path[:-1]], 0)
        sums, outputs = cum[[t - 1 for t in taus]], path[taus]
    else:
        raise ValueError(f"unknown ODE method {method!r}")
    as_tensor = lambda a: torch.from_numpy(np.ascontiguousarray(np.swapaxes(a, -1, -2))).to(  # noqa: E731
        f0.device, f0.dtype
    )
    return Evolution(list(taus), as_tensor(sums), as_tensor(outputs), rate)


def _euler_sums(H: np.ndarray, Y: np.ndarray, rate: float, f: np.ndarray, taus: list[int]):
    """Unit steps f_{s+1} = f_s - rate H (softmax(f_s) - Y), with the whole kernel every step. Keeps only
    the running sum of the gradients (the left Riemann sums) and the values at the candidate steps."""
    wanted = {t: i for i, t in enumerate(taus)}
    sums = np.empty((len(taus),) + f.shape, dtype=f.dtype)
    outputs = np.empty_like(sums)
    running = np.zeros_like(f)
    f = f.copy()
    for s in range(max(taus)):
        grad = _softmax_minus(f, Y)
        running += grad
        f -= rate * (grad @ H)
        if s + 1 in wanted:
            sums[wanted[s + 1]], outputs[wanted[s + 1]] = running, f
    return sums, outputs


def _softmax_minus(f: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """softmax(f) - Y over axis 0 (classes), for f and Y laid out (C, N), so the class sums are fast
    elementwise passes. Logits are clipped to [-60, 60] instead of shifted by their maximum: one pass
    instead of three, no overflow (10 e^60 is far from float32's limit), no denormals (e^-60 is a
    normal float32; denormals would slow every following product), and a softmax that only changes
    where a probability is below 1e-26 anyway."""
    e = np.clip(f, -60.0, 60.0)
    np.exp(e, out=e)
    e /= e.sum(0)
    e -= Y
    return e


SPLIT_RANK, SPLIT_WARMUP, SPLIT_MAX_GAP, FULL_SPLIT = 16, 16, 64, 96
SPLIT_TOL, DEFLATE_TOL, SPLIT_SUBSTEPS, SPLIT_STIFF, SPLIT_SLOW = 1e-3, 1e-4, 4, 5.0, 0.25
SPLIT_THREE_HALVES = True  # steps of 1.5 units where the rate is at most 2 SPLIT_STIFF / 1.5; False: of 1
SPLIT_WIDE = True  # SSPRK(4,3) after the warm-up; False: RK3 steps (make bench compares the two)


def _split_kernel(H: np.ndarray, rate: float):
    """H = V M V^T + H2 with V (N, 16) close to the top eigen-subspace (the stiff part) and M = V^T H V:
    returns V^T, M, (V M)^T and the remainder rate * H2 (scaled once, so the loop does no scaling). Up to
    FULL_SPLIT samples V is the whole eigenbasis and there is no remainder (an empty H2): there a kernel
    product costs no more than the rank-16 part does at a thousand samples, and the remainder would be
    large."""
    from p2pfl.ntk import split_loop

    if H.shape[0] <= FULL_SPLIT:
        lam, V = np.linalg.eigh(H.astype(np.float64))
        Vt, M = np.ascontiguousarray(V.T.astype(H.dtype)), np.diag(lam).astype(H.dtype)
        return Vt, M, np.ascontiguousarray((lam[:, None] * V.T).astype(H.dtype)), np.empty((0, 0), H.dtype)
    Vt = top_subspace(H[None], SPLIT_RANK, split_loop.CompiledRows)[0]
    VtH, M, VMt = np.empty_like(Vt), np.empty((SPLIT_RANK, SPLIT_RANK), H.dtype), np.empty_like(Vt)
    split_loop.product(Vt, H, VtH, len(Vt))
    split_loop.project(VtH, Vt, M)  # V^T H V
    split_loop.project(np.ascontiguousarray(M.T), np.ascontiguousarray(Vt.T), VMt)  # (V M)^T
    H2 = np.empty_like(H)
    split_loop.remainder(H, VMt, Vt, np.float32(rate), H2)
    return Vt, M, VMt, H2


MAX_STIFFNESS = 640.0  # steps of 1/64 unit, 128 times a flow's usual work; the papers' trained kernels are at 4 to 8


def check_stiffness(stiffness: float) -> None:
    """The integrators' work grows with the stiffest rate (eta/N) lambda_max: bounded by refusing to go on
    past MAX_STIFFNESS, where lr is far above the kernel's stable range (gradient descent on the same
    kernel diverges past a rate of 4) and the run would spend hours in one round."""
    if not stiffness <= MAX_STIFFNESS:  # NaN too
        raise DivergenceError(
            f"the kernel evolution is too stiff to integrate: its stiffest rate eta lambda_max / N "
            f"is {stiffness:.4g}, above {MAX_STIFFNESS:g} (gradient descent diverges past 4); "
            "lower --lr"
        )


def step_plan(stiffness: float, euler: bool = False) -> tuple[int, float]:
    """(substeps per unit in the warm-up, step length after it) for a kernel whose stiffest rate is
    stiffness = (eta/N) lambda_max. The softmax's Jacobian has eigenvalues up to 1/2, so a step h sees at
    most h stiffness / 2: SSPRK(4,3) (stability interval 5.15) steps of 2 units while stiffness <=
    SPLIT_STIFF, of 1.5 up to 4/3 SPLIT_STIFF, of 1/k beyond; without SPLIT_WIDE (or for Euler), RK3
    (interval 2.51) steps of 1/k. The warm-up's RK3 steps are SPLIT_SUBSTEPS times as short. Past
    MAX_STIFFNESS, none (DivergenceError); Euler's unit steps do not depend on it."""
    if not euler:
        check_stiffness(stiffness)
    warm_steps = SPLIT_SUBSTEPS * max(1, math.ceil(stiffness / SPLIT_STIFF))
    if not SPLIT_WIDE or euler:
        return warm_steps, 1.0 / max(1, math.ceil(stiffness / SPLIT_STIFF))
    if stiffness <= SPLIT_STIFF:
        return warm_steps, 2.0
    if SPLIT_THREE_HALVES and 1.5 * stiffness <= 2 * SPLIT_STIFF:
        return warm_steps, 1.5
    return warm_steps, 1.0 / math.ceil(stiffness / (2 * SPLIT_STIFF))


def _split_sums(H, Y, rate, f, taus, euler: bool):
    """The compiled whole-step loop (split_loop.left_sums) on the split kernel: the stiff rank-16 part
    exactly at every stage, the remainder lazily (see there). None where the split does not apply.

    euler ('deflated'): unit Euler steps, gradient descent on the linearized model, at a fraction of
    the cost of applying H every step. Otherwise ('split'): an accurate ODE solution at whole steps, for
    the left Riemann sums: SSPRK(4,3) steps of two units (the unit between by cubic Hermite
    interpolation) where the kernel's stiffest rate allows, of 1.5 units (two steps for three units, the
    units inside interpolated the same way), one unit or shorter where it is stiffer,
    and quarter RK3 steps during the first 16 (the stiff top modes' transient). Measured against a
    tight reference solution on Fashion-MNIST neighbourhoods of 300 peers: within 1.4e-5 to 3.9e-5 in
    the weight update on four of round 2, 3.8e-5 to 4.9e-5 on four of round 16 (trained, stiffer)."""
    from p2pfl.ntk import split_loop

    Vt, M, VMt, H2 = _split_kernel(H, rate)
    ritz = np.linalg.eigvalsh(M)
    if not euler and len(H2) and rate * float(ritz[0]) > SPLIT_SLOW:
        check_stiffness(rate * float(ritz[-1]))  # the fallback's steps shrink with it as well
        return None  # the rest of the spectrum is not slow: the split does not pay, the caller falls back
    warm_steps, h = step_plan(rate * float(ritz[-1]), euler)
    wide = SPLIT_WIDE and not euler
    wanted = np.full(max(taus) + 1, -1, dtype=np.int64)
    wanted[list(taus)] = np.arange(len(taus))
    sums = np.empty((len(taus),) + f.shape, dtype=f.dtype)
    outputs = np.empty_like(sums)
    split_loop.left_sums(
        f.copy(),
        Y,
        Vt,
        (-rate * VMt).astype(f.dtype),
        H2,
        DEFLATE_TOL if euler else SPLIT_TOL,
        SPLIT_WARMUP,
        SPLIT_MAX_GAP,
        wanted,
        warm_steps,
        h,
        euler,
        wide,
        sums,
        outputs,
        np.frombuffer(stopping.NOW, np.int8),  # the flag itself, as an array
    )
    return sums, outputs


RTOL, ATOL = 1e-5, 1e-6


def _adaptive_whole_steps(rhs, f0: np.ndarray, t_max: int) -> np.ndarray:
    """Bogacki-Shampine 3(2) with error control (rtol 1e-5, atol 1e-6) and cubic Hermite dense output
    at s = 0, 1, ..., t_max: the accurate ODE solution the reference code gets from its adaptive solver,
    with as few kernel products as the trajectory's smoothness and stiffness allow."""
    out = np.empty((t_max + 1,) + f0.shape, dtype=f0.dtype)
    out[0] = f0
    t, f, k1, h, filled = 0.0, f0, rhs(f0), 1.0, 1
    for _ in range(_adaptive_step_bound(t_max)):
        if filled > t_max:
            return out
        h = min(h, t_max - t) if t < t_max else h
        k2 = rhs(f + 0.5 * h * k1)
        k3 = rhs(f + 0.75 * h * k2)
        f_new = f + h * (2 / 9 * k1 + 1 / 3 * k2 + 4 / 9 * k3)
        k4 = rhs(f_new)
        err = h * (-5 / 72 * k1 + 1 / 12 * k2 + 1 / 9 * k3 - 1 / 8 * k4)
        scale = ATOL + RTOL * np.maximum(np.abs(f), np.abs(f_new))
        ratio = float(np.max(np.abs(err) / scale))
        if ratio <= 1.0:
            while filled <= t_max and filled <= t + h + 1e-9:  # Hermite on [t, t+h]
                th = (filled - t) / h
                out[filled] = (
                    (2 * th**3 - 3 * th**2 + 1) * f
                    + (th**3 - 2 * th**2 + th) * h * k1
                    + (-2 * th**3 + 3 * th**2) * f_new
                    + (th**3 - th**2) * h * k4
                )
                filled += 1
            t, f, k1 = t + h, f_new, k4
        h *= min(5.0, max(0.2, 0.9 * (ratio + 1e-12) ** (-1 / 3)))
    if filled > t_max:
        return out
    raise DivergenceError(
        f"the kernel evolution took {_adaptive_step_bound(t_max):,} steps for {t_max} units and "
        "is not done: the kernel is too stiff for this lr; lower --lr"
    )


def _adaptive_step_bound(t_max: int) -> int:
    """Twice the tries that MAX_STIFFNESS's stable steps (about 1/128 unit for this solver) would take, plus
    the transient's."""
    return 256 * t_max + 10_000


def tight_ce_sums(
    H: torch.Tensor, f0: torch.Tensor, Y: torch.Tensor, eta: float, taus: list[int], substeps: int = 4
) -> torch.Tensor:
    """The yardstick for the CE methods, not for runs: classic Runge-Kutta in float64 with quarter steps
    (eighth steps agree to 1e-7 at the paper's settings), left sums S_t at whole steps (T, N, C). Slow:
    every stage applies the whole kernel."""
    H, f, Y = H.double().cpu().numpy(), f0.double().cpu().numpy(), Y.double().cpu().numpy()
    rate, running, out, h = eta / len(H), np.zeros(f.shape), [], 1.0 / substeps

    def residual(g):
        e = np.exp(g - g.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True) - Y

    def slope(g):
        return -rate * (H @ residual(g))

    for s in range(1, max(taus) + 1):
        running += residual(f)
        for _ in range(substeps):
            k1 = slope(f)
            k2 = slope(f + h / 2 * k1)
            k3 = slope(f + h / 2 * k2)
            k4 = slope(f + h * k3)
            f = f + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        if s in taus:
            out.append(running.copy())
    return torch.from_numpy(np.stack(out))


def evolve_mse(H: torch.Tensor, f0: torch.Tensor, Y: torch.Tensor, eta: float, taus: list[int]) -> Evolution:
    """The reference code's MSE path, exactly: with H = V diag(lambda) V^T (lambda clamped at 0) and
    x = eta lambda / (N C), f_s - Y = V e^{-x s} V^T (f0 - Y), and the right sum
    S_t = sum_{s=1..t} (f_s - Y) = V [(1 - e^{-x t}) / (e^x - 1)] V^T (f0 - Y) (t where x = 0)."""
    N, C = H.shape[0], Y.shape[1]
    lam, V = torch.linalg.eigh(H.double())
    x = (eta / (N * C)) * lam.clamp(min=0)
    B = V.T @ (f0 - Y).double()
    t = torch.tensor(taus, dtype=torch.float64, device=H.device)[:, None]
    decay = torch.exp(-x[None] * t)  # (T, N)
    small = x < 1e-12
    safe_x = torch.where(small, torch.ones_like(x), x)
    right_sum = torch.where(small[None], t.expand_as(decay), -torch.expm1(-x[None] * t) / torch.expm1(safe_x)[None])
    outputs = Y.double() + torch.einsum("nk,tk,kc->tnc", V, decay, B)
    sums = torch.einsum("nk,tk,kc->tnc", V, right_sum, B)
    return Evolution(list(taus), sums.to(f0.dtype), outputs.to(f0.dtype), eta / (N * C))


def evolve(kind: str, H, f0, Y, eta, taus, ode: str = "split") -> Evolution:
    """The evolution; where it is too stiff to integrate (check_stiffness), NaN: the peer's new weights are
    NaN, and the round's end stops every rank together with exit 3 (metrics.check_finite), as a diverged
    run, instead of one rank stopping while the others wait for its messages."""
    if kind == "mse":
        return evolve_mse(H, f0, Y, eta, taus)
    try:
        return evolve_ce(H, f0, Y, eta, taus, ode)
    except DivergenceError:
        return diverged(f0, eta, taus)


def diverged(f0: torch.Tensor, eta: float, taus: list[int]) -> Evolution:
    """An evolution of NaN, in f0's shape, for every candidate."""
    nan = torch.full((len(taus), *f0.shape), float("nan"), dtype=f0.dtype, device=f0.device)
    return Evolution(list(taus), nan, nan.clone(), float(eta) / len(f0))


def linearized_loss(kind: str, evolution: Evolution, Y: torch.Tensor) -> torch.Tensor:
    """Loss of the evolved outputs f_t per candidate: (T,). The NTK-DFL paper's appendix-C rule. Under
    the CE flow it falls monotonically in t (NTK-FL's Remark 1), so it selects the largest candidate;
    NTK-FL selects by the true network's loss (eq. 11a) instead."""
    if kind == "mse":
        return 0.5 * ((evolution.outputs - Y) ** 2).sum(-1).mean(-1)
    return -(torch.log_softmax(evolution.outputs, -1) * Y).sum(-1).mean(-1)
