"""The NTK math: factored == dense, evolution == explicit gradient descent, and one NTK-DFL peer step
re-done independently with torch.autograd."""

import pytest
import torch
import torch.nn.functional as F

from p2pfl.models import MLP, ParamLayout, PeerStack, initial_parameters
from p2pfl.ntk import DenseJacobian, FactoredJacobian
from p2pfl.models import MLPShape
from p2pfl.ntk.compression import decode, encode, gaussian_projection
from p2pfl.ntk.evolution import evolve_ce, evolve_mse
from p2pfl.ntk.step import NTKSettings, ntk_step
from p2pfl.local.forward import candidate_losses


def random_mlp(hidden, n_in=9, n_out=4, seed=0):
    model = MLP(n_in, hidden, n_out)
    flat = initial_parameters(model, [0], seed, "same", torch.device("cpu"))[0]
    flat = flat + 0.1 * torch.randn(flat.shape, generator=torch.Generator().manual_seed(seed))  # non-zero biases
    return model, ParamLayout(model), flat


@pytest.mark.parametrize("hidden", [[7], [8, 6], [5, 6, 7], []])
def test_factored_equals_dense_kernel_and_transpose(hidden):
    model, layout, w = random_mlp(hidden)
    x = torch.randn(13, 9, generator=torch.Generator().manual_seed(1))
    shape = MLPShape.of(model, layout)
    fac, f_fac = FactoredJacobian.compute(shape, w, x)
    den, f_den = DenseJacobian.compute(model, layout, w, x, chunk=5)
    assert torch.allclose(f_fac, f_den, atol=1e-5)
    assert torch.allclose(fac.kernel(shape, w), den.kernel(), rtol=1e-4, atol=1e-4)
    R = torch.randn(3, 13, 4)
    assert torch.allclose(fac.transpose_apply(shape, w, R), den.transpose_apply(shape, w, R), rtol=1e-4, atol=1e-4)
    assert torch.allclose(fac.dense(shape, w), den.J, rtol=1e-5, atol=1e-6)  # the privacy attack's dummy Jacobians


def test_factored_wire_roundtrip_and_concatenation():
    model, layout, w = random_mlp([8, 6])
    shape = MLPShape.of(model, layout)
    a, _ = FactoredJacobian.compute(shape, w, torch.randn(5, 9))
    b, _ = FactoredJacobian.compute(shape, w, torch.randn(4, 9))
    both = FactoredJacobian.cat([FactoredJacobian.from_wire(a.to_wire()), b])
    assert both.n == 9
    assert any(t.dtype == torch.uint8 for t in a.to_wire())  # ReLU gates travel as bytes
    K = both.kernel(shape, w)
    assert torch.allclose(K[:5, :5], a.kernel(shape, w), atol=1e-5)


@pytest.mark.parametrize("hidden", [[7], [8, 6], []])
def test_stacked_kernel_by_blocks_and_given_input_grams_equals_the_dense_one(hidden):
    """The kernel of stacked parts is taken block by block (upper triangle, mirrored), with the inputs
    Grams the caller passes where it has them: the same kernel as the dense Jacobians give."""
    model, layout, w = random_mlp(hidden)
    shape = MLPShape.of(model, layout)
    xs = [torch.randn(n, 9, generator=torch.Generator().manual_seed(n)) for n in (5, 7, 3)]
    parts = [FactoredJacobian.compute(shape, w, x)[0] for x in xs]
    dense = DenseJacobian.compute(model, layout, w, torch.cat(xs), chunk=5)[0].kernel()
    for grams in (None, [p.input_gram() for p in parts], [None, parts[1].input_gram(), None]):
        K = FactoredJacobian.cat(parts, grams).kernel(shape, w)
        assert torch.allclose(K, dense, rtol=1e-4, atol=1e-4)
        assert torch.equal(K[:5, 5:], K[5:, :5].T)  # the lower blocks are the upper ones mirrored
    wrong = FactoredJacobian.cat(parts, [None, 2 * parts[1].input_gram(), None]).kernel(shape, w)
    assert not torch.allclose(wrong, dense, rtol=1e-4, atol=1e-4)  # the given Gram is what is used


@pytest.mark.parametrize("loss,selection", [("ce", "linearized"), ("ce", "network"), ("mse", "linearized")])
def test_factored_and_dense_steps_pick_the_same_weights(loss, selection):
    model, layout, w = random_mlp([10])
    x = torch.randn(40, 9, generator=torch.Generator().manual_seed(2))
    y = torch.randint(0, 4, (40,), generator=torch.Generator().manual_seed(3))
    shape = MLPShape.of(model, layout)
    settings = NTKSettings(loss=loss, taus=(5, 10, 20), selection=selection, ode="euler")

    def network_loss(cands):
        logits = torch.stack([torch.func.functional_call(model, layout.views(c), (x,)) for c in cands])
        return torch.stack([F.cross_entropy(l, y) for l in logits])

    results = []
    for jac, f0 in (FactoredJacobian.compute(shape, w, x), DenseJacobian.compute(model, layout, w, x)):
        results.append(ntk_step(jac, shape, w, f0, y, 4, 0.5, settings, network_loss))
    assert results[0].tau == results[1].tau
    assert torch.allclose(results[0].weights, results[1].weights, rtol=1e-4, atol=1e-5)


def linear_problem(n=30, d=6, c=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    model = MLP(d, [], c)  # one Linear layer: the NTK is exact and constant
    layout = ParamLayout(model)
    w0 = torch.randn(layout.size, generator=gen) * 0.3
    x, y = torch.randn(n, d, generator=gen), torch.randint(0, c, (n,), generator=gen)
    return model, layout, w0, x, y


def gd(model, layout, w, x, y, lr, steps, loss):
    w = w.clone()
    for _ in range(steps):
        w.requires_grad_(True)
        out = torch.func.functional_call(model, layout.views(w), (x,))
        Y = F.one_hot(y, out.shape[1]).float()
        value = F.cross_entropy(out, y) if loss == "ce" else 0.5 * ((out - Y) ** 2).sum(1).mean()
        (g,) = torch.autograd.grad(value, w)
        w = (w - lr * g).detach()
    return w


def test_euler_ce_evolution_equals_gradient_descent_on_a_linear_model():
    model, layout, w0, x, y = linear_problem()
    shape = MLPShape.of(model, layout)
    jac, f0 = FactoredJacobian.compute(shape, w0, x)
    H, Y = jac.kernel(shape, w0), F.one_hot(y, 3).float()
    eta, taus = 0.7, [1, 7, 25]
    evo = evolve_ce(H, f0, Y, eta, taus, "euler")
    for i, t in enumerate(taus):
        w_t = w0 - eta / len(x) * jac.transpose_apply(shape, w0, evo.residual_sums[i : i + 1])[0]
        assert torch.allclose(w_t, gd(model, layout, w0, x, y, eta, t, "ce"), atol=1e-5)


def test_mse_closed_form_equals_gradient_descent_in_the_small_step_limit():
    """The reference code's closed form is gradient flow on the halved squared error averaged over the
    N*C output entries: explicit GD with step eta/m for m*t steps converges to it."""
    model, layout, w0, x, y = linear_problem()
    shape = MLPShape.of(model, layout)
    jac, f0 = FactoredJacobian.compute(shape, w0, x)
    H, Y = jac.kernel(shape, w0), F.one_hot(y, 3).float()
    eta, t, m = 0.3, 100, 20
    evo = evolve_mse(H, f0, Y, eta, [t])
    w_gd = gd(model, layout, w0, x, y, eta / m / 3, t * m, "mse")  # gd's loss sums the 3 classes
    f_gd = torch.func.functional_call(model, layout.views(w_gd), (x,))
    assert torch.allclose(evo.outputs[0], f_gd, atol=2e-3)  # (its weights use whole-step sums: see below)


def test_mse_reproduces_the_reference_code_exactly():
    """Outputs exp(-eta s H/(N C)) applied to f0 - Y, the right sum over s = 1..t, weights scaled by
    eta/(N C): recomputed here with a dense matrix exponential and the dense Jacobian."""
    torch.manual_seed(0)
    model, layout, w0 = random_mlp([5], n_in=6, n_out=4)
    x, y = torch.randn(12, 6), torch.randint(0, 4, (12,))
    shape = MLPShape.of(model, layout)
    jac, f0 = FactoredJacobian.compute(shape, w0, x)
    eta, taus, N, C = 0.3, (3, 40, 200), 12, 4
    settings = NTKSettings(loss="mse", taus=taus, selection="network")
    mse = lambda cands: candidate_losses(stack, cands, x, y, "mse")  # noqa: E731
    stack = PeerStack(model)
    result = ntk_step(jac, shape, w0, f0, y, C, eta, settings, mse)
    Jd = DenseJacobian.compute(model, layout, w0, x)[0].J.double()  # (N, C, D)
    H = torch.einsum("mcd,ncd->mn", Jd, Jd) / C
    Y = F.one_hot(y, C).double()
    cands = []
    for t in taus:
        r = sum(torch.linalg.matrix_exp(-eta * s / (N * C) * H) @ (f0.double() - Y) for s in range(1, t + 1))
        cands.append(w0.double() - eta / (N * C) * torch.einsum("ncd,nc->d", Jd, r))
    cands = torch.stack(cands)
    losses = torch.stack(
        [
            0.5 * ((torch.func.functional_call(model, layout.views(c.float()), (x,)) - Y.float()) ** 2).sum(1).mean()
            for c in cands
        ]
    )
    best = int(torch.argmin(losses))
    assert result.tau == taus[best]
    assert torch.allclose(result.losses, losses, rtol=1e-4)
    assert torch.allclose(result.weights.double(), cands[best], rtol=1e-4, atol=1e-6)


def test_adaptive_ode_matches_fine_euler():
    model, layout, w0, x, y = linear_problem(seed=3)
    shape = MLPShape.of(model, layout)
    jac, f0 = FactoredJacobian.compute(shape, w0, x)
    H, Y = jac.kernel(shape, w0), F.one_hot(y, 3).float()
    ada = evolve_ce(H, f0, Y, 0.2, [10, 40], "adaptive")
    fine = evolve_ce(H, f0, Y, 0.2 / 64, [640, 2560], "euler")  # the same flow in 64x smaller steps
    assert torch.allclose(ada.outputs, fine.outputs, atol=1e-3)


def test_topk_and_quantization():
    J = torch.randn(4, 3, 50, generator=torch.Generator().manual_seed(0))
    keep = decode(encode(J, keep=0.25))
    assert (keep != 0).sum() == 150 and torch.equal(keep[keep != 0], J[keep != 0])
    assert keep.abs().max() == J.abs().max()
    q = encode(J, keep=0.5, bits=6)
    back = decode(q)
    kept = back != 0
    step = float(J.abs().max() * 2 / 63)
    assert float((back[kept] - J[kept]).abs().max()) <= step
    assert sum(t.numel() * t.element_size() for t in q) < 0.25 * J.numel() * 4  # 6 bits each + a bitmask
    full = decode(encode(J, bits=8))
    assert float((full - J).abs().max()) <= float(J.max() - J.min()) / 255


def test_projection_is_shared_by_seed():
    assert torch.equal(gaussian_projection(784, 200, 5), gaussian_projection(784, 200, 5))
    assert not torch.equal(gaussian_projection(784, 200, 5), gaussian_projection(784, 200, 6))


@pytest.mark.slow  # a dense Jacobian of a neighbourhood, computed twice
def test_one_ntk_dfl_peer_step_against_an_independent_dense_computation():
    from tests.helpers import make_context
    from topologies import mixing_weights

    ctx, algo = make_context(algo="ntk-dfl", peers=6, kappa=2, init="different", lr=0.5, ntk_taus=[5, 20, 60])
    start = ctx.flat.clone()
    algo.round(0)
    graph, peer = ctx.schedule.graph(0), 0
    rows = mixing_weights(graph, "uniform")
    wbar = sum(w * start[j] for j, w in rows[peer])
    hood = sorted(list(graph.neighbors(peer)) + [peer])
    index = torch.cat([ctx.shards[j] for j in hood])
    x, y = ctx.data.train_x[index], ctx.data.train_y[index]
    model, views = ctx.stack.model, ctx.stack.layout.views

    def f(w):
        return torch.func.functional_call(model, views(w), (x,))

    J = torch.autograd.functional.jacobian(f, wbar)  # (N, C, D), plain autograd
    N, C, _ = J.shape
    H = torch.einsum("mcd,ncd->mn", J, J) / C
    Y = F.one_hot(y, C).float()
    eta, fs, acc, cands = 0.5, f(wbar).detach(), torch.zeros(N, C), []

    def slope(f):
        return -eta / N * H @ (torch.softmax(f, -1) - Y)

    for s in range(1, 61):  # the ODE, by classic Runge-Kutta in eighth steps; left sums at whole steps
        acc = acc + torch.softmax(fs, -1) - Y
        for _ in range(8):
            k1 = slope(fs)
            k2 = slope(fs + k1 / 16)
            k3 = slope(fs + k2 / 16)
            k4 = slope(fs + k3 / 8)
            fs = fs + (k1 + 2 * k2 + 2 * k3 + k4) / 48
        if s in (5, 20, 60):
            cands.append(wbar - eta / N * torch.einsum("nc,ncd->d", acc, J))
    losses = [F.cross_entropy(f(c), y) for c in cands]
    expected = cands[int(torch.argmin(torch.stack(losses)))]
    update, expected_update = ctx.flat[peer] - wbar, expected - wbar
    assert float((update - expected_update).norm() / expected_update.norm()) < 1e-4
    assert not torch.allclose(expected, wbar)


def test_the_papers_standard_projection_is_the_scaled_one_times_root_d_out():
    from tests.helpers import make_context

    scaled, standard = gaussian_projection(64, 16, 3), gaussian_projection(64, 16, 3, standard=True)
    assert torch.allclose(standard, scaled * 4.0) and abs(float(standard.std()) - 1) < 0.1
    runs = {
        entries: make_context(
            algo="cp-ntk-fl",
            topology="star",
            peers=4,
            clients_per_round=2,
            ntk_projection=16,
            ntk_projection_entries=entries,
        )[0].data.test_x
        for entries in ("scaled", "standard")
    }
    assert torch.allclose(runs["standard"], runs["scaled"] * 4.0, rtol=1e-5, atol=1e-5)
