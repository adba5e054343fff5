"""Products with 8-bit pixel inputs, done as exact integer arithmetic on the CPU.

Fashion-MNIST and MNIST inputs are an affine image of 8-bit pixel levels: x = alpha k + beta, k in 0..255.
The NTK step's largest products all have the inputs X as one factor: the inputs' Gram X X^T (the
kernel), the candidates' first layer W X^T (selection) and the backprop's A X (their weights). An
int8 product runs about five times as fast as a float32 one on a CPU with 8-bit dot-product
instructions, and the pixels are exact int8 numbers (k - 128). Without those instructions it is the
slower one (25-33x slower than float32 on an AVX2-only EPYC), so the codes are taken only on a CPU that
has them. The other, float, factor is written as three int8 digits per entry, q1 + q2/254 + q3/254^2
times one scale per row, which holds it to about 6e-8 of the row's largest entry, float32's own
precision. Every integer product is exact, so the
results are also the same on any number of threads.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass

import torch

BASE = 254  # a digit's range: rounding a remainder in [-1/2, 1/2] times BASE stays within int8
MAX_ROWS = 100_000  # rows and features, at most: sums of 100,000 terms of 127 x 128 stay within int32


INT8_DOT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")  # /proc/cpuinfo's names for 8-bit dot products


@functools.cache
def int8_products_fast() -> bool:
    """Whether this CPU has 8-bit dot-product instructions, read once per process (Linux's /proc/cpuinfo);
    elsewhere no, and the NTK products stay float32."""
    return sys.platform.startswith("linux") and has_int8_dot_products("/proc/cpuinfo")


def has_int8_dot_products(cpuinfo: str) -> bool:
    """Whether the first flags line of a /proc/cpuinfo file names an 8-bit dot-product extension."""
    try:
        with open(cpuinfo) as info:
            flags = next((line.split(":", 1)[1].split() for line in info if line.startswith("flags")), [])
    except OSError:
        return False
    return any(flag in flags for flag in INT8_DOT_FLAGS)


@dataclass
class PixelInputs:
    codes: torch.Tensor  # (n, d) int8: k - 128
    codes_t: torch.Tensor  # (d, n) the same, transposed (contiguous: what the products take)
    alpha: float  # x = alpha * code + zero
    zero: float  # the input value of code 0 (pixel level 128)

    @staticmethod
    def encode(x: torch.Tensor, levels: tuple[float, float] | None, where_slow: bool = False) -> "PixelInputs | None":
        """x (n, ...) as codes, where levels = (alpha, beta) describe it and every entry lies on them (to
        float32 rounding); None where not, where the inputs are not float32 on the CPU, or where this CPU's
        int8 products are not the faster ones (unless where_slow: a benchmark timing them anyway)."""
        x = x.reshape(len(x), -1)
        if (
            levels is None
            or not (where_slow or int8_products_fast())
            or x.device.type != "cpu"
            or x.dtype != torch.float32
            or x.numel() == 0
            or max(x.shape) > MAX_ROWS
        ):
            return None
        alpha, beta = levels
        k = torch.round((x - beta) / alpha)
        if not bool(((k >= 0) & (k <= 255)).all()):
            return None
        if float((x - (alpha * k + beta)).abs().max()) > 1e-5 * (abs(beta) + 255 * alpha):
            return None
        codes = (k - 128).to(torch.int8)
        return PixelInputs(codes, codes.T.contiguous(), alpha, beta + 128 * alpha)

    @staticmethod
    def cat(parts: list["PixelInputs | None"]) -> "PixelInputs | None":
        """The parts' rows stacked; None where there are none, a part is None or the stack is too tall for
        int32 sums."""
        if not parts or any(p is None for p in parts) or sum(len(p.codes) for p in parts) > MAX_ROWS:
            return None
        return PixelInputs(
            torch.cat([p.codes for p in parts]), torch.cat([p.codes_t for p in parts], 1), parts[0].alpha, parts[0].zero
        )

    @property
    def nbytes(self) -> int:
        return self.codes.numel() * 2  # the codes and their transpose, a byte each

    def rows(self, index: torch.Tensor) -> "PixelInputs":
        return PixelInputs(self.codes[index], self.codes_t[:, index].contiguous(), self.alpha, self.zero)

    def gram(self, start: int = 0, end: int | None = None) -> torch.Tensor:
        """Rows start:end of X X^T against the columns from start on (the whole Gram by default), float32:
        alpha^2 K K^T + alpha zero (s_m + s_n) + d zero^2, with s the codes' row sums."""
        d, end = self.codes.shape[1], len(self.codes) if end is None else end
        exact = torch._int_mm(self.codes[start:end], self.codes_t[:, start:]).to(torch.float32)
        sums = self.codes[start:].sum(1, dtype=torch.int32).to(torch.float32)
        half = (self.alpha * self.zero) * sums + 0.5 * d * self.zero**2
        return exact.mul_(self.alpha**2).add_(half[: end - start, None]).add_(half[None, :])

    def left(self, A: torch.Tensor) -> torch.Tensor:
        """A X (M, d) for a float A (M, n)."""
        return self._times(A, self.codes)

    def right(self, W: torch.Tensor) -> torch.Tensor:
        """W X^T (M, n) for a float W (M, d): each row of W applied to every input."""
        return self._times(W, self.codes_t)

    def _times(self, A: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """A times the inputs laid out as codes (k, m): alpha (A codes) + zero (A's row sums), per column."""
        scale, digits = _digits(A)
        out = _combine(torch._int_mm(digits, codes), len(A), scale)
        return out.mul_(self.alpha).add_((self.zero * A.sum(1))[:, None])


def _digits(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A (M, k) as scale (M, 1) and digits (3 M, k) int8: A = scale (q1 + q2 / BASE + q3 / BASE^2)."""
    scale = A.abs().amax(1, keepdim=True) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # a zero row: any scale
    rest = A / scale
    digits = torch.empty((3, *A.shape), dtype=torch.int8, device=A.device)
    for j in range(3):
        q = torch.round(rest)
        digits[j] = q
        if j < 2:
            rest.sub_(q).mul_(BASE)
    return scale, digits.view(3 * len(A), -1)


def _combine(products: torch.Tensor, M: int, scale: torch.Tensor) -> torch.Tensor:
    """The three digits' exact products (3 M, k) int32 summed with their weights, times the rows' scale."""
    p = products.to(torch.float32)
    out = torch.add(p[M : 2 * M], p[2 * M :], alpha=1 / BASE)
    return torch.add(p[:M], out, alpha=1 / BASE).mul_(scale)
