"""Evolution of a neighbourhood's outputs under the NTK, for every candidate step count t at once.

With N samples, kernel H (N, N), outputs f0 and one-hot labels Y (N, C), learning rate eta:

- cross-entropy (the NTK-DFL/NTK-FL reference code): df/ds = -(eta/N) H (softmax(f) - Y), s in steps.
  'euler' takes whole steps, which is exactly gradient descent on the linearized model; 'deflated'
  computes the same steps faster (the kernel's stiff top subspace every step, the rest every few
  steps and extrapolated in between); 'adaptive' integrates the ODE accurately (an embedded
  Runge-Kutta pair with error control and dense output at whole steps), as the reference code's
  adaptive solver does.
- MSE, closed form (paper eqs. 4-5): f_t - Y = exp(-eta t H / N) (f0 - Y), from one eigendecomposition.

Both return, per candidate t, the accumulated loss gradient along the trajectory S_t (for CE the left
Riemann sum over whole steps, sum_{s<t} dL/df(f_s), as the reference code; for MSE the exact integral
of the flow) and the evolved outputs f_t. The weights are w_t = w0 - (eta/N) J^T S_t (paper eq. 5; its
extra 1/d2 is left out so that the weights reproduce the evolved outputs on the linearized model).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Evolution:
    taus: list[int]
    residual_sums: torch.Tensor  # (T, N, C): S_t
    outputs: torch.Tensor  # (T, N, C): f_t


def evolve_ce(H: torch.Tensor, f0: torch.Tensor, Y: torch.Tensor, eta: float, taus: list[int],
              method: str = "deflated") -> Evolution:
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
    if method == "euler":
        sums, outputs = _euler_sums(Hn, Yn, rate, f_start, taus)
    elif method == "deflated":
        sums, outputs = _deflated_euler_sums(Hn, Yn, rate, f_start, taus)
    elif method == "adaptive":
        path = _adaptive_whole_steps(rhs, f_start, t_max)
        cum = np.cumsum([_softmax_minus(p, Yn) for p in path[:-1]], 0)
        sums, outputs = cum[[t - 1 for t in taus]], path[taus]
    else:
        raise ValueError(f"unknown ODE method {method!r}")
    as_tensor = lambda a: torch.from_numpy(np.ascontiguousarray(np.swapaxes(a, -1, -2))).to(  # noqa: E731
        f0.device, f0.dtype)
    return Evolution(list(taus), as_tensor(sums), as_tensor(outputs))


def _euler_sums(H: np.ndarray, Y: np.ndarray, rate: float, f: np.ndarray, taus: list[int]):
    """Unit steps f_{s+1} = f_s - rate H (softmax(f_s) - Y), keeping only the running sum of the
    gradients and the values at the candidate steps (no stored trajectory)."""
    wanted = {t: i for i, t in enumerate(taus)}
    sums = np.empty((len(taus),) + f.shape, dtype=f.dtype)
    outputs = np.empty_like(sums)
    running = np.zeros_like(f)
    for s in range(1, max(taus) + 1):
        grad = _softmax_minus(f, Y)
        running += grad
        f = f - rate * (grad @ H)
        if s in wanted:
            sums[wanted[s]], outputs[wanted[s]] = running, f
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


def top_subspace(H: np.ndarray, r: int, iterations: int = 6, seed: int = 0) -> np.ndarray:
    """An orthonormal basis (N, r) close to the top-r eigenvectors of H: subspace iteration."""
    Q = np.random.default_rng(seed).standard_normal((H.shape[0], r)).astype(H.dtype)
    for _ in range(iterations):
        Q, _ = np.linalg.qr(H @ Q)
    return Q


DEFLATE_RANK, DEFLATE_TOL, DEFLATE_WARMUP, DEFLATE_MAX_GAP = 16, 1e-4, 16, 32


def _deflated_euler_sums(H, Y, rate, f, taus):
    """The unit-step Euler trajectory at a fraction of the cost of applying H every step.

    H = V M V^T + H2 with V the top-16 eigen-subspace (M = V^T H V): the stiff part V M V^T is applied
    exactly every step (cheap: rank 16), the remainder H2 P_s only every few steps and linearly
    extrapolated in between. The gap between exact products adapts so that the extrapolation error,
    as it moves the logits over a gap, stays under 1e-4; the first 16 steps are exact."""
    r = min(DEFLATE_RANK, H.shape[0])
    V = top_subspace(H, r)
    VM = V @ (V.T @ H @ V)
    H2 = rate * (H - VM @ V.T)  # scaled by the rate once, so the loop does no scaling
    VMt = np.ascontiguousarray(rate * VM.T)
    wanted = {t: i for i, t in enumerate(taus)}
    sums = np.empty((len(taus),) + f.shape, dtype=f.dtype)
    outputs = np.empty_like(sums)
    running = np.zeros_like(f)
    f = f.copy()
    last_s, last_q, slope = 0, None, np.zeros_like(f)
    gap, next_exact, q = 1, 0, None
    for s in range(max(taus)):
        grad = _softmax_minus(f, Y)
        running += grad
        if s == next_exact:
            exact = grad @ H2
            if last_q is not None:
                if s > DEFLATE_WARMUP:
                    miss = gap * float(np.abs(q + slope - exact).max())  # q + slope: extrapolated to s
                    gap = max(1, gap // 2) if miss > DEFLATE_TOL else (
                        min(DEFLATE_MAX_GAP, gap * 2) if miss < DEFLATE_TOL / 8 else gap)
                elif s == DEFLATE_WARMUP:
                    gap = 2
                slope = (exact - last_q) / (s - last_s)
            last_s, last_q, q = s, exact, exact.copy()
            next_exact = s + gap
        else:
            q += slope
        f -= (grad @ V) @ VMt
        f -= q
        if s + 1 in wanted:
            sums[wanted[s + 1]], outputs[wanted[s + 1]] = running, f
    return sums, outputs


RTOL, ATOL = 1e-5, 1e-6


def _adaptive_whole_steps(rhs, f0: np.ndarray, t_max: int) -> np.ndarray:
    """Bogacki-Shampine 3(2) with error control (rtol 1e-5, atol 1e-6) and cubic Hermite dense output
    at s = 0, 1, ..., t_max: the accurate ODE solution the reference code gets from its adaptive solver,
    with as few kernel products as the trajectory's smoothness and stiffness allow."""
    out = np.empty((t_max + 1,) + f0.shape, dtype=f0.dtype)
    out[0] = f0
    t, f, k1, h, filled = 0.0, f0, rhs(f0), 1.0, 1
    while filled <= t_max:
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
                out[filled] = ((2 * th**3 - 3 * th**2 + 1) * f + (th**3 - 2 * th**2 + th) * h * k1
                               + (-2 * th**3 + 3 * th**2) * f_new + (th**3 - th**2) * h * k4)
                filled += 1
            t, f, k1 = t + h, f_new, k4
        h *= min(5.0, max(0.2, 0.9 * (ratio + 1e-12) ** (-1 / 3)))
    return out


def evolve_mse(H: torch.Tensor, f0: torch.Tensor, Y: torch.Tensor, eta: float, taus: list[int]) -> Evolution:
    """Closed form from one eigendecomposition H = V diag(lambda) V^T, with x = eta*lambda/N:
    f_t - Y = V e^{-x t} V^T (f0 - Y)   (paper eq. 4), and
    S_t = integral_0^t (f_u - Y) du = V [(1 - e^{-x t}) / x] V^T (f0 - Y)   (eq. 5's sum over u, taken as
    the integral of the same flow, so that the linearized model at w_t gives exactly f_t; the left
    Riemann sum over whole steps differs from it by a factor 1 + x/2 + ... per mode)."""
    N = H.shape[0]
    lam, V = torch.linalg.eigh(H.double())
    x = (eta / N) * lam.clamp(min=0)
    B = V.T @ (f0 - Y).double()
    t = torch.tensor(taus, dtype=torch.float64)[:, None]
    decay = torch.exp(-x[None] * t)  # (T, N)
    small = x < 1e-12
    safe_x = torch.where(small, torch.ones_like(x), x)
    integral = torch.where(small[None], t.expand_as(decay), -torch.expm1(-x[None] * t) / safe_x[None])
    outputs = Y.double() + torch.einsum("nk,tk,kc->tnc", V, decay, B)
    sums = torch.einsum("nk,tk,kc->tnc", V, integral, B)
    return Evolution(list(taus), sums.to(f0.dtype), outputs.to(f0.dtype))


def evolve(kind: str, H, f0, Y, eta, taus, ode: str = "deflated") -> Evolution:
    return evolve_mse(H, f0, Y, eta, taus) if kind == "mse" else evolve_ce(H, f0, Y, eta, taus, ode)


def linearized_loss(kind: str, evolution: Evolution, Y: torch.Tensor) -> torch.Tensor:
    """Loss of the evolved outputs f_t per candidate (the paper's appendix-C criterion): (T,)."""
    if kind == "mse":
        return 0.5 * ((evolution.outputs - Y) ** 2).sum(-1).mean(-1)
    return -(torch.log_softmax(evolution.outputs, -1) * Y).sum(-1).mean(-1)
