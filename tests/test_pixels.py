"""Products with 8-bit pixel inputs in integer arithmetic: as accurate as float32 products, the same on
any number of threads, used by the factored kernel, its transpose and the candidates' first layer, and
refused for inputs that are not pixels."""

import pytest
import torch

from p2pfl.models import MLP, ParamLayout, PeerStack, initial_parameters
from p2pfl.ntk import FactoredJacobian
from p2pfl.models import MLPShape
from p2pfl.ntk.pixels import PixelInputs
from p2pfl.local.forward import candidate_losses

pytestmark = pytest.mark.usefixtures("int8_codes")
LEVELS = (1 / (255 * 0.3530), -0.2860 / 0.3530)  # Fashion-MNIST's


def pixel_inputs(n, d=64, seed=0):
    """Inputs made as the idx reader makes them: (k / 255 - mean) / std in float32."""
    k = torch.randint(0, 256, (n, d), generator=torch.Generator().manual_seed(seed))
    return k.to(torch.float32).div_(255.0).sub_(0.2860).div_(0.3530)


def relative_error(got, exact):
    return float((got.double() - exact).abs().max() / exact.abs().max())


def test_products_match_float64_at_least_as_well_as_float32():
    x = pixel_inputs(300, 784)
    pixels = PixelInputs.encode(x, LEVELS)
    gen = torch.Generator().manual_seed(1)
    W, A = 0.05 * torch.randn(200, 784, generator=gen), torch.randn(150, 300, generator=gen)
    X = x.double()
    for got, float32, exact in (
        (pixels.gram(), x @ x.T, X @ X.T),
        (pixels.right(W), W @ x.T, W.double() @ X.T),
        (pixels.left(A), A @ x, A.double() @ X),
    ):
        assert relative_error(got, exact) < 3e-7
        assert relative_error(got, exact) <= 2 * relative_error(float32, exact)
    assert torch.equal(pixels.right(torch.zeros(3, 784)), torch.zeros(3, 300))  # a zero row: no division by 0
    assert torch.equal(pixels.gram(100, 180), pixels.gram()[100:180, 100:])  # a panel of the kernel's


def test_products_are_the_same_on_any_number_of_threads():
    x = pixel_inputs(500, 784, seed=2)
    pixels = PixelInputs.encode(x, LEVELS)
    W, A = torch.randn(800, 784), torch.randn(800, 500)
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2, 3, 4):
            torch.set_num_threads(n)
            results.append((pixels.gram(), pixels.right(W), pixels.left(A)))
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))


def test_inputs_that_are_not_pixels_are_refused():
    x = pixel_inputs(20)
    assert PixelInputs.encode(x, LEVELS) is not None
    assert PixelInputs.encode(x + 1e-3, LEVELS) is None  # off the levels
    assert PixelInputs.encode(x + 3.0, LEVELS) is None  # beyond level 255
    assert PixelInputs.encode(x, None) is None  # the data has no levels
    assert PixelInputs.encode(x.double(), LEVELS) is None
    assert PixelInputs.cat([PixelInputs.encode(x, LEVELS), None]) is None and PixelInputs.cat([]) is None


@pytest.mark.parametrize("hidden", [[7], [8, 6]])
def test_kernel_transpose_and_candidate_outputs_with_pixels_equal_the_float_ones(hidden):
    model = MLP(64, hidden, 4)
    layout = ParamLayout(model)
    w = initial_parameters(model, [0], 0, "same", torch.device("cpu"))[0]
    shape = MLPShape.of(model, layout)
    xs = [pixel_inputs(n, seed=n) for n in (5, 7, 3)]
    parts = [FactoredJacobian.compute(shape, w, x)[0] for x in xs]
    plain = FactoredJacobian.cat(parts)
    pixels = PixelInputs.cat([PixelInputs.encode(x, LEVELS) for x in xs])
    fast = FactoredJacobian.cat(parts, pixels=pixels)
    assert torch.allclose(fast.kernel(shape, w), plain.kernel(shape, w), rtol=1e-5, atol=1e-5)
    R = torch.randn(3, 15, 4)
    assert torch.allclose(fast.transpose_apply(shape, w, R), plain.transpose_apply(shape, w, R), rtol=1e-5, atol=1e-5)
    half = torch.arange(0, 15, 2)
    assert torch.allclose(fast.rows(half).kernel(shape, w), plain.rows(half).kernel(shape, w), rtol=1e-5, atol=1e-5)
    stack = PeerStack(model)
    candidates, x, y = w[None] + 0.01 * torch.randn(5, len(w)), torch.cat(xs), torch.randint(0, 4, (15,))
    assert torch.allclose(
        candidate_losses(stack, candidates, x, y, pixels=pixels), candidate_losses(stack, candidates, x, y), rtol=1e-5
    )


def test_without_8_bit_dot_products_the_runs_take_float_products(monkeypatch):
    """On a CPU without 8-bit dot-product instructions torch's int8 product is 25-33x slower than float32's
    (an AVX2-only EPYC), so encode declines and the NTK products stay float32."""
    from p2pfl.ntk import pixels

    monkeypatch.setattr(pixels, "int8_products_fast", lambda: False)
    assert PixelInputs.encode(pixel_inputs(8), LEVELS) is None


@pytest.mark.parametrize(
    "flags, fast", [("fpu avx2 avx512f", False), ("fpu avx2 avx_vnni", True), ("fpu avx512f avx512_vnni", True)]
)
def test_the_cpus_8_bit_dot_products_are_read_from_its_flags(tmp_path, flags, fast):
    from p2pfl.ntk.pixels import has_int8_dot_products

    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nmodel name\t: some cpu\nflags\t\t: {flags}\n\nprocessor\t: 1\n")
    assert has_int8_dot_products(str(info)) is fast
    assert has_int8_dot_products(str(tmp_path / "absent")) is False
