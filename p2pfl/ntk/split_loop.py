"""The inner loop of the 'split' CE integrator, compiled (numba): whole steps of Heun's third-order
Runge-Kutta (or of SSPRK(4,3), for stiffer kernels) on df/ds = -(eta/N) (V M V^T + H2) (softmax(f) - Y),
with the rank-r part applied exactly at every stage and the remainder H2 g given as a polynomial in time
(its lazy extrapolation).

Why compiled: a stage is a softmax and two thin products over a (C, N) array, some 30 us of numpy
calls, and an evolution has about 2,500 stages. Compiled, a stage takes about 17 us, and the
loop runs without the GIL, so a rank's evolution threads really run in parallel (numpy's small calls
made two threads slower than one). Arrays are laid out (C, N); everything is float32.

Why every helper left_sums calls is inlined (inline="always"): a jitted callee is linked into its
caller as a shared (weak) symbol, and the process runs whichever copy of that symbol it loaded first.
A fresh compile loads the callees' own builds before left_sums; a process that loads left_sums from
numba's cache runs the copies inside it. With fastmath the two builds round differently, so a first
run after installing (or editing this file) gave other numbers than every later run. Inlined, there
is one build, and a fresh compile and a cached one give bitwise the same results.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from numba import njit

from p2pfl.ntk import numerics

# numba's cache follows the file a compiled function is defined in (this one), not the files of what it
# inlines: the steps inlined from numerics.py are pinned by their hash here. Where numerics.py differs
# (edited since this line), the loop compiles afresh in every process instead of loading a stale cache;
# tests/test_split_loop.py fails until this line is updated, which makes numba recompile once.
NUMERICS_SHA256 = "019e49946b7512d093e4ca5f0797630ac36b6c45408443f9f135dbaeee9f9daa"
CACHE = hashlib.sha256(Path(numerics.__file__).read_bytes()).hexdigest() == NUMERICS_SHA256

CORRECTION = 0.375  # the integral over [0, 1] of x (x + 1) (x + 2) / 6: the quadratic's error over equal gaps
_LOG2E, _LN2_HI, _LN2_LO = (
    np.float32(1.4426950408889634),
    np.float32(0.693145751953125),
    np.float32(1.4286068203094173e-06),
)


@njit(nogil=True, fastmath=True, cache=CACHE, inline="always")
def softmax_minus(x, Y, out, tot, bits):
    """out = softmax(x) - Y over axis 0 (classes), logits clipped to [-60, 60] as in the numpy loop.
    exp is a degree-7 polynomial on the reduced argument times 2^k built from its exponent bits: the
    compiler vectorizes it (it does not vectorize a call to expf); within 2e-7 of float64."""
    C, N = x.shape
    scale = bits.view(np.float32)
    for n in range(N):
        tot[n] = 0.0
    for c in range(C):
        for n in range(N):
            v = min(np.float32(60.0), max(np.float32(-60.0), x[c, n]))
            k = np.floor(v * _LOG2E + np.float32(0.5))
            r = v - k * _LN2_HI - k * _LN2_LO
            out[c, n] = np.float32(1.0) + r * (
                np.float32(1.0)
                + r
                * (
                    np.float32(0.5)
                    + r
                    * (
                        np.float32(1 / 6)
                        + r
                        * (
                            np.float32(1 / 24)
                            + r * (np.float32(1 / 120) + r * (np.float32(1 / 720) + r * np.float32(1 / 5040)))
                        )
                    )
                )
            )
            bits[n] = (np.int32(k) + np.int32(127)) << np.int32(23)
        for n in range(N):
            e = out[c, n] * scale[n]
            out[c, n] = e
            tot[n] += e
    for n in range(N):
        tot[n] = np.float32(1.0) / tot[n]
    for c in range(C):
        for n in range(N):
            out[c, n] = out[c, n] * tot[n] - Y[c, n]


@njit(nogil=True, fastmath=True, cache=CACHE, inline="always")
def project(g, Vt, proj):
    """proj = g Vt^T (C, r), in blocks of 2 classes x 8 vectors: each pass over n loads ten rows' values
    for sixteen sums (2 x 2 blocks: four for four; measured 1.3x faster at C = 10, r = 16)."""
    C, N = g.shape
    r = Vt.shape[0]
    pairs, eights = C - C % 2, r - r % 8
    for c in range(0, pairs, 2):
        for k in range(0, eights, 8):
            a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = np.float32(0.0)
            b0 = b1 = b2 = b3 = b4 = b5 = b6 = b7 = np.float32(0.0)
            for n in range(N):
                x, y = g[c, n], g[c + 1, n]
                v0, v1, v2, v3 = Vt[k, n], Vt[k + 1, n], Vt[k + 2, n], Vt[k + 3, n]
                v4, v5, v6, v7 = Vt[k + 4, n], Vt[k + 5, n], Vt[k + 6, n], Vt[k + 7, n]
                a0 += x * v0
                a1 += x * v1
                a2 += x * v2
                a3 += x * v3
                a4 += x * v4
                a5 += x * v5
                a6 += x * v6
                a7 += x * v7
                b0 += y * v0
                b1 += y * v1
                b2 += y * v2
                b3 += y * v3
                b4 += y * v4
                b5 += y * v5
                b6 += y * v6
                b7 += y * v7
            proj[c, k], proj[c, k + 1], proj[c, k + 2], proj[c, k + 3] = a0, a1, a2, a3
            proj[c, k + 4], proj[c, k + 5], proj[c, k + 6], proj[c, k + 7] = a4, a5, a6, a7
            proj[c + 1, k], proj[c + 1, k + 1], proj[c + 1, k + 2], proj[c + 1, k + 3] = b0, b1, b2, b3
            proj[c + 1, k + 4], proj[c + 1, k + 5], proj[c + 1, k + 6], proj[c + 1, k + 7] = b4, b5, b6, b7
    for c in range(C):
        for k in range(r):
            if c < pairs and k < eights:
                continue
            acc = np.float32(0.0)
            for n in range(N):
                acc += g[c, n] * Vt[k, n]
            proj[c, k] = acc


@njit(nogil=True, fastmath=True, cache=CACHE, inline="always")
def _slope(g, Vt, top, q, slope, curvature, at, s1, s2, out, proj):
    """out = (g V) top - (q + a slope + b curvature) at time `at`, a = at - s2 and b = (at - s2)(at - s1):
    -(eta/N) H g with the remainder's polynomial through its exact products at s0 < s1 < s2."""
    a, b = np.float32(at - s2), np.float32((at - s2) * (at - s1))
    C, N = g.shape
    project(g, Vt, proj)
    r = Vt.shape[0]
    pairs, eights = C - C % 2, r - r % 8
    # two classes and eight rows of top at a time (the polynomial with the first eight): a pass loads eight
    # rows of top for sixteen products (one class, four rows: four; measured 1.4x faster at C = 10, r = 16)
    for c in range(0, pairs, 2):
        if eights == 0:
            for n in range(N):
                out[c, n] = -(q[c, n] + a * slope[c, n] + b * curvature[c, n])
                out[c + 1, n] = -(q[c + 1, n] + a * slope[c + 1, n] + b * curvature[c + 1, n])
        for k in range(0, eights, 8):
            p0, p1, p2, p3 = proj[c, k], proj[c, k + 1], proj[c, k + 2], proj[c, k + 3]
            p4, p5, p6, p7 = proj[c, k + 4], proj[c, k + 5], proj[c, k + 6], proj[c, k + 7]
            o0, o1, o2, o3 = proj[c + 1, k], proj[c + 1, k + 1], proj[c + 1, k + 2], proj[c + 1, k + 3]
            o4, o5, o6, o7 = proj[c + 1, k + 4], proj[c + 1, k + 5], proj[c + 1, k + 6], proj[c + 1, k + 7]
            for n in range(N):
                t0, t1, t2, t3 = top[k, n], top[k + 1, n], top[k + 2, n], top[k + 3, n]
                t4, t5, t6, t7 = top[k + 4, n], top[k + 5, n], top[k + 6, n], top[k + 7, n]
                x = p0 * t0 + p1 * t1 + p2 * t2 + p3 * t3 + p4 * t4 + p5 * t5 + p6 * t6 + p7 * t7
                y = o0 * t0 + o1 * t1 + o2 * t2 + o3 * t3 + o4 * t4 + o5 * t5 + o6 * t6 + o7 * t7
                if k == 0:
                    out[c, n] = x - (q[c, n] + a * slope[c, n] + b * curvature[c, n])
                    out[c + 1, n] = y - (q[c + 1, n] + a * slope[c + 1, n] + b * curvature[c + 1, n])
                else:
                    out[c, n] += x
                    out[c + 1, n] += y
        for k in range(eights, r):
            p, o = proj[c, k], proj[c + 1, k]
            for n in range(N):
                out[c, n] += p * top[k, n]
                out[c + 1, n] += o * top[k, n]
    for c in range(pairs, C):
        for n in range(N):
            out[c, n] = -(q[c, n] + a * slope[c, n] + b * curvature[c, n])
        for k in range(r):
            p = proj[c, k]
            for n in range(N):
                out[c, n] += p * top[k, n]


@njit(nogil=True, fastmath=True, cache=CACHE, inline="always")
def _stage_slope(u, at, state):
    """F(u) at time `at` for the SSPRK(4,3) step (numerics.ssprk43_with): softmax(u) - Y, then the slope;
    state carries the loop's arrays (the result is its buffer k: read before the next stage)."""
    Y, Vt, top, q2, slope, curvature, s1, s2, g2, k, proj, tot, bits, _ = state
    softmax_minus(u, Y, g2, tot, bits)
    _slope(g2, Vt, top, q2, slope, curvature, at, s1, s2, k, proj)
    return k


_numerics_hermite = njit(nogil=True, fastmath=True, inline="always")(numerics.hermite)
_numerics_stage = njit(nogil=True, fastmath=True, inline="always")(numerics.ssprk43_stage)


@njit(nogil=True, fastmath=True, cache=CACHE, inline="always")
def _stage_into(j, f, u, k, h, state):
    """numerics.ssprk43_stage on each entry, into the loop's stage buffer (u may be that buffer)."""
    out = state[-1]
    C, N = f.shape
    for c in range(C):
        for n in range(N):
            out[c, n] = _numerics_stage(j, f[c, n], u[c, n], k[c, n], h)
    return out


@njit(nogil=True, fastmath=True, cache=CACHE, inline="always")
def _interpolate_into(y0, m0, y1, m1, theta, h, out):
    """numerics.hermite on each entry, into out (which may be y0)."""
    C, N = out.shape
    for i in range(C):
        for n in range(N):
            out[i, n] = _numerics_hermite(y0[i, n], m0[i, n], y1[i, n], m1[i, n], theta, h)


# One SSPRK(4,3) step (p2pfl.ntk.numerics), compiled into the loop and inlined like every helper here
_ssprk43 = njit(nogil=True, fastmath=True, inline="always")(numerics.ssprk43_with(_stage_slope, _stage_into))


@njit(nogil=True, fastmath=True, cache=CACHE)
def left_sums(f, Y, Vt, top, H2, tol, warmup, max_gap, wanted, warm_steps, h, euler, wide, sums, outputs, stop):
    """The whole evolution from f (C, N), in place: at whole steps s = 0 .. len(wanted) - 2, the running
    left sum of g(f_s) = softmax(f_s) - Y, stored with f in sums/outputs at the steps that wanted marks
    (wanted[s] = candidate index, -1 for none). Steps are unit Euler steps (euler), or Heun's RK3 in
    steps of 1 / warm_steps before `warmup` and of length h after it; with `wide`, the steps after the
    warmup are the four-stage, third-order SSPRK(4,3) instead (Spiteri and Ruuth), whose stability
    interval on the negative real axis is 5.15 against RK3's 2.51: of length h = 2 (two units of time
    for 4 stages, f at the unit between them by cubic Hermite interpolation from both ends and their
    slopes), h = 1.5 (two steps for three units, the two units inside by the same interpolation on the
    step that holds each) or h = 1 / k.

    The slope is -(eta/N) H g = (g V) top - q(u): the rank-r part exactly, and the remainder product
    q = H2 g (H2 already scaled by eta/N; empty: no remainder) exact at some whole steps and extrapolated
    in between by the quadratic through the last three exact ones (the line through the last two at
    first). At each exact product after the warmup, the extrapolation's miss there times the gap it
    spanned (how far the miss moved the logits) sets the next gap, scaled by 0.8 (tol / miss)^(1/4): a
    quadratic extrapolation errs as gap^3; and f is corrected by that estimate of how far the miss moved
    it (CORRECTION), which leaves the gaps free to be about twice as long for the same accuracy. Exact
    products fall on the starts of the steps of several units, where f is a state, not an interpolation.
    The first `warmup` steps are all exact (and not corrected: there the stiff modes' transient damps
    most of a miss within the step, and a correction made the results worse).

    stop (p2pfl.stopping.NOW) is read at every whole step: set, the loop returns at once, its results
    unfinished (a signal stops the run; the round is thrown away)."""
    C, N = f.shape
    r = Vt.shape[0]
    last = len(wanted) - 1
    lazy = H2.shape[0] > 0
    grad, g2 = np.empty_like(f), np.empty_like(f)
    k1, k3, stage = np.empty_like(f), np.empty_like(f), np.empty_like(f)
    # steps longer than a unit: one of 2 or two of 1.5 cover `span` units; f and F at the end (ahead) and,
    # for 1.5, in the middle (mid); the units inside by cubic Hermite interpolation
    span = (2 if h == 2.0 else 3) if wide and h > 1.0 else 1
    mid, mid_slope = np.empty_like(f), np.empty_like(f)
    ahead, ahead_slope = np.empty_like(f), np.empty_like(f)
    span_end = 0
    running = np.zeros_like(f)
    proj = np.empty((C, r), np.float32)
    tot = np.empty(N, np.float32)
    bits = np.empty(N, np.int32)
    # the remainder's last three exact products q0, q1, q2 at steps s0 < s1 < s2, and its polynomial
    q0, q1, q2, exact = np.zeros_like(f), np.zeros_like(f), np.zeros_like(f), np.zeros_like(f)
    slope, curvature = np.zeros_like(f), np.zeros_like(f)
    s0, s1, s2, known, gap, due = 0, 0, 0, 0, 1, 0
    slope_ahead = False  # ahead_slope is F(f_s) for this s, with the remainder polynomial still current
    softmax_minus(f, Y, grad, tot, bits)
    for s in range(last):
        if stop[0]:
            return
        if lazy and s == due:
            slope_ahead = False
            # g's classes sum to zero (softmax minus one-hot), so H2 g's do: the last row is minus the rest
            product(grad, H2, exact, C - 1)
            for n in range(N):
                exact[C - 1, n] = 0.0
            for c in range(C - 1):
                for n in range(N):
                    exact[C - 1, n] -= exact[c, n]
            if s > warmup:
                # the extrapolation's miss d here grew from zero over the gap, about as the cube of the time
                # since s2 (the quadratic's error term), so its time integral, the logits' error, is about
                # CORRECTION * gap * d: taken off f (and its g recomputed) before the loop goes on
                miss = 0.0
                a, b = np.float32(s - s2), np.float32((s - s2) * (s - s1))
                shift = np.float32(CORRECTION * (s - s2))
                for c in range(C):
                    for n in range(N):
                        d = exact[c, n] - (q2[c, n] + a * slope[c, n] + b * curvature[c, n])
                        miss = max(miss, abs(d))
                        f[c, n] -= shift * d
                softmax_minus(f, Y, grad, tot, bits)
                factor = min(2.0, max(0.5, 0.8 * (tol / max(gap * miss, 1e-30)) ** 0.25))
                gap = max(1, min(max_gap, int(np.floor(gap * factor + 0.5))))
            elif s == warmup:
                gap = 2
            q0, q1, q2, exact = q1, q2, exact, q0
            s0, s1, s2 = s1, s2, s
            known += 1
            if known >= 2:
                for c in range(C):
                    for n in range(N):
                        new_slope = (q2[c, n] - q1[c, n]) / np.float32(s2 - s1)
                        if known >= 3 and s > warmup:
                            curvature[c, n] = (new_slope - (q1[c, n] - q0[c, n]) / np.float32(s1 - s0)) / np.float32(
                                s2 - s0
                            )
                        slope[c, n] = new_slope
            due = s + gap
            if span > 1 and due > warmup and (due - warmup) % span:
                due += span - (due - warmup) % span  # at a step's start, where f is a state of its own to correct
        for c in range(C):
            for n in range(N):
                running[c, n] += grad[c, n]
        multi = span > 1 and s >= warmup
        if multi and s < span_end:  # a unit inside a step of several units, taken with it
            if s + 1 == span_end:
                f[:] = ahead
            else:  # the second unit of three: a third of the way into the second step of 1.5
                _interpolate_into(mid, mid_slope, ahead, ahead_slope, 1 / 3, 1.5, f)
        elif multi and s + span <= last:
            if slope_ahead:
                k1[:] = ahead_slope
            else:
                _slope(grad, Vt, top, q2, slope, curvature, s, s1, s2, k1, proj)
            # one step of 2 units to ahead, or two of 1.5 through mid; F at each step's end
            steps = span - 1
            length = span / steps
            start, start_slope = f, k1
            for i in range(steps):
                end, end_slope = (ahead, ahead_slope) if i == steps - 1 else (mid, mid_slope)
                state = (Y, Vt, top, q2, slope, curvature, s1, s2, g2, k3, proj, tot, bits, stage)
                end[:] = _ssprk43(start, start_slope, s + i * length, length, state)
                softmax_minus(end, Y, g2, tot, bits)
                _slope(g2, Vt, top, q2, slope, curvature, s + (i + 1) * length, s1, s2, end_slope, proj)
                start, start_slope = mid, mid_slope
            slope_ahead = True
            span_end = s + span
            if span == 2:  # the unit between: the middle of the step
                _interpolate_into(f, k1, ahead, ahead_slope, 0.5, 2.0, f)
            else:  # the first unit of three: two thirds into the first step of 1.5
                _interpolate_into(f, k1, mid, mid_slope, 2 / 3, 1.5, f)
        elif euler:
            _slope(grad, Vt, top, q2, slope, curvature, s, s1, s2, k1, proj)
            for c in range(C):
                for n in range(N):
                    f[c, n] += k1[c, n]
        elif wide and s >= warmup:
            step = min(h, 1.0)  # the last units, fewer than a span, take unit steps
            for i in range(int(np.floor(1.0 / step + 0.5))):
                u = s + i * step
                if i > 0:
                    softmax_minus(f, Y, grad, tot, bits)
                _slope(grad, Vt, top, q2, slope, curvature, u, s1, s2, k1, proj)
                state = (Y, Vt, top, q2, slope, curvature, s1, s2, g2, k3, proj, tot, bits, stage)
                f[:] = _ssprk43(f, k1, u, step, state)
        else:
            n_sub = warm_steps if s < warmup else int(np.floor(1.0 / h + 0.5))
            sub = 1.0 / n_sub
            for i in range(n_sub):
                u = s + i * sub
                if i > 0:
                    softmax_minus(f, Y, grad, tot, bits)
                for j in range(3):  # the stages at u, u + sub/3, u + 2 sub/3
                    at = u + j * sub / 3
                    if j == 0:
                        _slope(grad, Vt, top, q2, slope, curvature, at, s1, s2, k1, proj)
                        coef, base = np.float32(sub / 3), k1
                    else:
                        softmax_minus(stage, Y, g2, tot, bits)
                        _slope(g2, Vt, top, q2, slope, curvature, at, s1, s2, k3, proj)
                        coef, base = np.float32(2 * sub / 3), k3
                    if j < 2:
                        for c in range(C):
                            for n in range(N):
                                stage[c, n] = f[c, n] + coef * base[c, n]
                w1, w3 = np.float32(sub / 4), np.float32(3 * sub / 4)
                for c in range(C):
                    for n in range(N):
                        f[c, n] += w1 * k1[c, n] + w3 * k3[c, n]
        if wanted[s + 1] >= 0:
            sums[wanted[s + 1]] = running
            outputs[wanted[s + 1]] = f
        if multi and s + 1 == span_end:
            grad[:] = g2  # g(f_{s+1}) = g of the steps' end, computed with them
        else:
            softmax_minus(f, Y, grad, tot, bits)


@njit(nogil=True, fastmath=True, cache=CACHE, inline="always")
def product(g, H, out, C):
    """out[:C] = g[:C] @ H for g (., N) and a symmetric H (N, N), eight rows of H at a time so it is read
    once, three classes per pass over them: a pass loads eight rows of H and three of out for 24
    products (four rows, one class: four; measured 1.9x faster at C = 9, N = 1,185). The rows are
    counted, not sliced: a slice's layout is not known to be contiguous when compiled, and its loops
    then ran 2x slower than before. numpy's BLAS serializes calls from several threads here; this runs
    in parallel."""
    N = g.shape[1]
    for c in range(C):
        for n in range(N):
            out[c, n] = 0.0
    eights, triples = N - N % 8, C - C % 3
    for m in range(0, eights, 8):
        for c in range(0, triples, 3):
            a0, a1, a2, a3 = g[c, m], g[c, m + 1], g[c, m + 2], g[c, m + 3]
            a4, a5, a6, a7 = g[c, m + 4], g[c, m + 5], g[c, m + 6], g[c, m + 7]
            b0, b1, b2, b3 = g[c + 1, m], g[c + 1, m + 1], g[c + 1, m + 2], g[c + 1, m + 3]
            b4, b5, b6, b7 = g[c + 1, m + 4], g[c + 1, m + 5], g[c + 1, m + 6], g[c + 1, m + 7]
            d0, d1, d2, d3 = g[c + 2, m], g[c + 2, m + 1], g[c + 2, m + 2], g[c + 2, m + 3]
            d4, d5, d6, d7 = g[c + 2, m + 4], g[c + 2, m + 5], g[c + 2, m + 6], g[c + 2, m + 7]
            for n in range(N):
                h0, h1, h2, h3 = H[m, n], H[m + 1, n], H[m + 2, n], H[m + 3, n]
                h4, h5, h6, h7 = H[m + 4, n], H[m + 5, n], H[m + 6, n], H[m + 7, n]
                out[c, n] += a0 * h0 + a1 * h1 + a2 * h2 + a3 * h3 + a4 * h4 + a5 * h5 + a6 * h6 + a7 * h7
                out[c + 1, n] += b0 * h0 + b1 * h1 + b2 * h2 + b3 * h3 + b4 * h4 + b5 * h5 + b6 * h6 + b7 * h7
                out[c + 2, n] += d0 * h0 + d1 * h1 + d2 * h2 + d3 * h3 + d4 * h4 + d5 * h5 + d6 * h6 + d7 * h7
        for c in range(triples, C):
            for i in range(8):
                w = g[c, m + i]
                for n in range(N):
                    out[c, n] += w * H[m + i, n]
    for m in range(eights, N):
        for c in range(C):
            w = g[c, m]
            for n in range(N):
                out[c, n] += w * H[m, n]


@njit(nogil=True, fastmath=True, cache=CACHE)
def remainder(H, At, Vt, rate, out):
    """out = rate (H - A V^T) for H (N, N), At = A^T and Vt = V^T (r, N): the split kernel's remainder."""
    r, N = Vt.shape
    for i in range(N):
        for j in range(N):
            out[i, j] = H[i, j]
        for k in range(r):
            a = At[k, i]
            for j in range(N):
                out[i, j] -= a * Vt[k, j]
        for j in range(N):
            out[i, j] *= rate


@njit(nogil=True, cache=CACHE)
def orthonormalize(At):
    """The rows of At (r, N), in place, made orthonormal: Gram-Schmidt run twice, sums in float64.
    (numpy's QR goes through its BLAS, whose threads spin against the evolution threads.)"""
    r, N = At.shape
    for k in range(r):
        for _ in range(2):
            for j in range(k):
                dot = 0.0
                for n in range(N):
                    dot += np.float64(At[k, n]) * np.float64(At[j, n])
                for n in range(N):
                    At[k, n] -= np.float32(dot) * At[j, n]
        norm = 0.0
        for n in range(N):
            norm += np.float64(At[k, n]) ** 2
        scale = np.float32(1.0 / max(np.sqrt(norm), 1e-30))
        for n in range(N):
            At[k, n] *= scale


class CompiledRows:
    """numerics.top_subspace's operations on the CPU, compiled: numpy's BLAS serializes calls from several threads,
    and these run in parallel (one kernel per thread). Arrays (B, rank, N) float32; B is 1 there."""

    @staticmethod
    def array(start: np.ndarray, like) -> np.ndarray:
        return start.astype(like.dtype)

    @staticmethod
    def times(Qt: np.ndarray, H: np.ndarray) -> np.ndarray:
        out = np.empty_like(Qt)
        for b in range(len(Qt)):
            product(Qt[b], H[b], out[b], len(Qt[b]))  # (H Q)^T = Q^T H for a symmetric H
        return out

    @staticmethod
    def orthonormal_rows(Qt: np.ndarray) -> np.ndarray:
        for b in range(len(Qt)):
            orthonormalize(Qt[b])  # Gram-Schmidt twice, sums in float64
        return Qt

    @staticmethod
    def coordinate_rows(Qt, small, sizes):
        for i in small:
            Qt[i] = 0.0
            Qt[i, : sizes[i], : sizes[i]] = np.eye(sizes[i], dtype=Qt.dtype)
        return Qt
