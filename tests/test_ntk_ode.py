"""The default CE evolution ('split' on the CPU, the batched products a GPU runs) against a tight,
independent solution of the ODE df/ds = -(eta/N) H (softmax(f) - Y) on real Fashion-MNIST neighbourhoods
of the sizes the presets make (60 to about 1,200 samples), the paper's lr 0.01 and candidates
t = 100..800: every candidate's weight update within 1e-4 (relative, 2-norm), and the same t chosen by
the true network's loss."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from p2pfl.runner.configure import make_config, resolve
from p2pfl.ntk import FactoredJacobian
from p2pfl.models import MLPShape
from p2pfl.ntk.batched_evolution import evolve_ce_batched
from p2pfl.ntk.evolution import evolve_ce, tight_ce_sums
from p2pfl.ntk.pixels import PixelInputs
from p2pfl.runner.assemble import build
from p2pfl.local.forward import candidate_losses

FMNIST = Path("/usr/share/datasets/fashion-mnist")
TAUS = [100, 200, 300, 400, 500, 600, 700, 800]


@pytest.mark.skipif(not FMNIST.exists(), reason="Fashion-MNIST (Debian's dataset-fashion-mnist) is not installed")
@pytest.mark.parametrize(
    "peers,kappa,samples,peer",
    [(30, 2, 20, 0), (30, 3, 100, 4), pytest.param(300, 5, 200, 7, marks=pytest.mark.slow)],  # slow: 1,200 samples
)
def test_evolution_matches_a_tight_ode_solution(peers, kappa, samples, peer):
    """The CPU's split evolution and a GPU's batched one (this kernel padded beside a larger one), each
    against the same tight solution."""
    cfg = resolve(
        make_config(
            {
                "algo": "ntk-dfl",
                "dataset": "fashion-mnist",
                "peers": peers,
                "kappa": kappa,
                "alpha": 0.1,
                "samples_per_peer": samples,
                "progress": False,
            }
        ),
        1,
    )
    ctx, _ = build(cfg, 0, 1, 0)
    hood = sorted(list(ctx.schedule.graph(0).neighbors(peer)) + [peer])
    index = torch.cat([ctx.shards[j] for j in hood])
    x, y = ctx.data.train_x[index], ctx.data.train_y[index]
    shape = MLPShape.of(ctx.stack.model, ctx.stack.layout)
    w = ctx.flat[0]
    jac, f0 = FactoredJacobian.compute(shape, w, x)
    # ours: the run's path (its products with the pixels in integer arithmetic, on a CPU with 8-bit dot
    # products); theirs: float32 products
    pixels = PixelInputs.encode(x, ctx.data.pixel_levels)
    fast = FactoredJacobian.cat([jac], pixels=pixels)
    Y, eta = F.one_hot(y, 10).float(), 0.01
    kernel = fast.kernel(shape, w)
    ref = tight_ce_sums(jac.kernel(shape, w), f0, Y, eta, TAUS)

    def updates(jacobian, sums):
        return (eta / len(y)) * jacobian.transpose_apply(shape, w, sums.float()).double()

    theirs = updates(jac, ref)
    other = torch.randn(len(y) + 7, 3 * len(y) // 2)
    for batched in (False, True):
        if batched:  # in a batch with a larger neighbourhood's kernel: its padding must not move this one
            ours = evolve_ce_batched(
                [kernel, other @ other.T / other.shape[1]],
                [f0, torch.zeros(len(y) + 7, 10)],
                [Y, F.one_hot(torch.arange(len(y) + 7) % 10, 10).float()],
                eta,
                TAUS,
            )[0]
        else:
            ours = evolve_ce(kernel, f0, Y, eta, TAUS)  # the default method
        mine = updates(fast, ours.residual_sums)
        errors = (mine - theirs).norm(dim=1) / theirs.norm(dim=1)
        assert float(errors.max()) < 1e-4, (batched, len(y), errors)
        pick = [
            int(torch.argmin(candidate_losses(ctx.stack, (w[None] - u).float(), x, y, pixels=p)))
            for u, p in ((mine, pixels), (theirs, None))
        ]
        assert pick[0] == pick[1], batched


@pytest.mark.skipif(not FMNIST.exists(), reason="Fashion-MNIST (Debian's dataset-fashion-mnist) is not installed")
@pytest.mark.parametrize(
    "algo", [pytest.param("ntk-dfl", marks=pytest.mark.slow), "ntk-fl"]
)  # ntk-fl takes the same path
def test_ntk_on_pixels_takes_integer_products_with_the_float_results(algo, int8_codes):
    """On Fashion-MNIST, the NTK algorithms take their kernel, weights and selection through the inputs'
    pixel codes (NTK-DFL keeps each peer's): the weights of two rounds match a run with float32 products."""

    def run(levels):
        cfg = resolve(
            make_config(
                {
                    "algo": algo,
                    "dataset": "fashion-mnist",
                    "peers": 10,
                    "kappa": 3,
                    "alpha": 0.1,
                    "samples_per_peer": 40,
                    "progress": False,
                }
            ),
            1,
        )
        ctx, algorithm = build(cfg, 0, 1, 0)
        ctx.data.pixel_levels = levels(ctx.data.pixel_levels)
        for r in range(2):
            algorithm.round(r)
        weights = ctx.flat if algo == "ntk-dfl" else ctx.global_weights
        return weights.clone(), algorithm.inputs.kept if algo == "ntk-dfl" else None

    fast, kept = run(lambda levels: levels)
    plain, kept_plain = run(lambda levels: None)
    if algo == "ntk-dfl":
        assert kept and all(isinstance(k, PixelInputs) for k in kept.values())
        assert not any(isinstance(k, PixelInputs) for k in kept_plain.values())
    assert not torch.equal(fast, plain)  # other arithmetic,
    assert torch.allclose(fast, plain, rtol=1e-4, atol=1e-5)  # the same results


@pytest.mark.skipif(not FMNIST.exists(), reason="Fashion-MNIST (Debian's dataset-fashion-mnist) is not installed")
def test_projected_inputs_are_no_longer_pixels():
    cfg = resolve(make_config({"algo": "cp-ntk-fl", "dataset": "fashion-mnist", "peers": 10, "progress": False}), 1)
    ctx, _ = build(cfg, 0, 1, 0)
    assert ctx.cfg.settings.ntk_projection and ctx.data.pixel_levels is None


def _random_problem(n: int, seed: int, top: float = 0.0):
    """A kernel of n samples, Wishart (top 0), or with 16 stiff eigenvalues up to top over a slow tail,
    as the NTK's are (the split applies); random outputs and labels."""
    gen = torch.Generator().manual_seed(seed)
    if top:
        U = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64)).Q
        lam = torch.cat(
            [
                torch.linspace(top, 0.24 * n, 16, dtype=torch.float64),
                torch.linspace(0.2 * n, 0.0, n - 16, dtype=torch.float64),
            ]
        )
        H = ((U * lam) @ U.T).float()
    else:
        A = torch.randn(n, 2 * n, generator=gen)
        H = A @ A.T / n
    return H, torch.randn(n, 10, generator=gen), F.one_hot(torch.randint(0, 10, (n,), generator=gen), 10).float()


@pytest.mark.parametrize("stiffness", [4.0, 6.0, 12.0], ids=["steps-of-2", "steps-of-1.5", "short-steps"])
def test_batched_evolution_is_each_kernels_own(stiffness):
    """Each kernel in a batch evolves as its own ODE, whatever its neighbours' sizes and stiffness: one
    integration loop takes the stiffest kernel's steps for all (shorter steps than a calmer kernel's own,
    so it is solved at least as accurately; small or fast-tailed kernels take the whole kernel at every
    stage beside the split ones): within 1e-4 of its evolution alone, and close to the tight solution."""
    from p2pfl.ntk.evolution import FULL_SPLIT, SPLIT_SLOW

    eta, taus = 1.0, [3, 20, 41, 60]
    problems = [
        _random_problem(150, 0, stiffness * 150),
        _random_problem(200, 1, 4.0 * 200),
        _random_problem(64, 2),
        _random_problem(23, 3),
    ]
    lam = torch.linalg.eigvalsh(problems[0][0].double())
    assert len(lam) > FULL_SPLIT and eta / 150 * float(lam[-16]) <= SPLIT_SLOW  # the split applies to the first
    together = evolve_ce_batched(*map(list, zip(*problems)), eta, taus)
    for (H, f0, Y), evo in zip(problems, together):
        alone = evolve_ce_batched([H], [f0], [Y], eta, taus)[0]
        assert evo.residual_sums.shape == (len(taus), len(H), 10)
        apart = float((evo.residual_sums - alone.residual_sums).norm() / alone.residual_sums.norm())
        assert apart < 1e-4, apart
        assert evo.scale == alone.scale == eta / len(H)
        ref = tight_ce_sums(H, f0, Y, eta, taus)
        off = (evo.residual_sums.double() - ref).norm(dim=(1, 2)) / ref.norm(dim=(1, 2))
        assert float(off.max()) < 1e-3, off


def test_batched_euler_steps_are_the_cpus():
    problems = [_random_problem(n, 5 + n) for n in (30, 50)]
    taus = [1, 7, 30]
    for (H, f0, Y), evo in zip(problems, evolve_ce_batched(*map(list, zip(*problems)), 0.5, taus, euler=True)):
        cpu = evolve_ce(H, f0, Y, 0.5, taus, "euler")
        assert torch.allclose(evo.residual_sums, cpu.residual_sums, atol=1e-4)
        assert torch.allclose(evo.outputs, cpu.outputs, atol=1e-4)


@pytest.mark.skipif(not FMNIST.exists(), reason="Fashion-MNIST (Debian's dataset-fashion-mnist) is not installed")
@pytest.mark.parametrize(
    "selection,style",
    [  # the other two selections take the same batched path (slow: 15 s each here)
        ("network", "per-peer"),
        pytest.param("own", "per-class", marks=pytest.mark.slow),
        pytest.param("linearized", "per-class", marks=pytest.mark.slow),
    ],
)
def test_ntk_dfl_rounds_with_the_batched_evolution_are_the_cpu_loops(monkeypatch, selection, style):
    """Two NTK-DFL rounds as a GPU takes them (the rank's neighbourhoods as one padded batch: kernels, one
    integration loop, candidates and selection), run here on the CPU, against the per-problem steps and
    the numba loop: the same t chosen at every peer, and weights within rounding; with each selection, and
    with shards of unequal sizes (per-class Dirichlet), so that neighbourhoods are padded."""
    import p2pfl.ntk.plan as plan
    import p2pfl.ntk.step as step

    def run(batched: bool):
        if batched:
            monkeypatch.setattr(step, "evolves_batched", lambda device, settings: True)
            monkeypatch.setattr(plan, "evolves_batched", lambda device, settings: True)
        cfg = resolve(
            make_config(
                {
                    "algo": "ntk-dfl",
                    "dataset": "fashion-mnist",
                    "peers": 8,
                    "kappa": 3,
                    "alpha": 0.1,
                    "samples_per_peer": 30,
                    "dirichlet_style": style,
                    "ntk_selection": selection,
                    "progress": False,
                }
            ),
            1,
        )
        ctx, algorithm = build(cfg, 0, 1, 0)
        for r in range(2):
            algorithm.round(r)
        sizes = set(ctx.sample_counts)
        return ctx.flat.clone(), list(algorithm.taus_chosen), (algorithm.plan.chunk, algorithm.plan.batched), sizes

    loop, taus_loop, chunk_loop, sizes = run(False)
    batch, taus_batch, chunk_batch, _ = run(True)
    assert (chunk_loop, chunk_batch) == ((plan.EVOLVE_CHUNK, False), (8, True))  # all 8 peers in one batch
    assert len(sizes) > 1 or style == "per-peer"
    assert taus_batch == taus_loop
    # within the cuda tests' tolerance: the batched Jacobians round apart from one at a time, and a ReLU gate
    # whose input is near zero can flip on that rounding (seen here: one peer 3.9e-4 apart, the rest 2e-6)
    assert float((batch - loop).norm() / loop.norm()) < 1e-3


@pytest.mark.parametrize("small", [1, 10, 16, 17])
def test_a_small_neighbourhood_beside_a_large_one_evolves_as_on_the_cpu(small):
    """A peer that heard nobody, or a tiny batch of samples, beside a full neighbourhood: its padded kernel
    has no top-16 subspace (Cholesky of a singular Gram raised LinAlgError); it takes its whole basis and
    evolves as the CPU's split method does, and the large one as it does alone."""
    gen = torch.Generator().manual_seed(small)
    problems = []
    for n in (300, small):
        A = torch.rand(n, 784, generator=gen)
        problems.append(
            (
                A @ A.T / 784 * 50,
                torch.randn(n, 10, generator=gen),
                F.one_hot(torch.randint(0, 10, (n,), generator=gen), 10).float(),
            )
        )
    eta, taus = 0.01, [100, 200]
    together = evolve_ce_batched(*map(list, zip(*problems)), eta, taus)
    for (H, f0, Y), evo in zip(problems, together):
        assert torch.isfinite(evo.residual_sums).all()
        ref = tight_ce_sums(H, f0, Y, eta, taus)
        off = (evo.residual_sums.double() - ref).norm(dim=(1, 2)) / ref.norm(dim=(1, 2))
        assert float(off.max()) < 1e-4, off
    cpu = evolve_ce(*problems[1], eta, taus)
    assert torch.allclose(together[1].residual_sums, cpu.residual_sums, rtol=1e-4, atol=1e-3)
    alone = evolve_ce_batched([problems[0][0]], [problems[0][1]], [problems[0][2]], eta, taus)[0]
    assert torch.allclose(together[0].residual_sums, alone.residual_sums, atol=1e-5)


@pytest.mark.parametrize(
    "ode", ["split", pytest.param("adaptive", marks=pytest.mark.slow)]
)  # the adaptive solver's steps
def test_a_kernel_too_stiff_to_integrate_evolves_to_nan_at_once(ode):
    """Past MAX_STIFFNESS the step count would grow without limit (with lr x lambda_max): the evolution
    is NaN instead, alone and in a batch beside a kernel that evolves. ('adaptive' goes on until its bound
    on steps, 256 a unit: far past MAX_STIFFNESS.)"""
    from p2pfl.ntk.evolution import MAX_STIFFNESS, evolve

    times = 2 if ode == "split" else 50
    stiff, calm = _random_problem(150, 0, times * MAX_STIFFNESS * 150), _random_problem(120, 1, 4.0 * 120)
    evo = evolve("ce", *stiff, 1.0, [50, 100], ode)
    assert evo.residual_sums.shape == (2, 150, 10) and torch.isnan(evo.residual_sums).all()
    both = evolve_ce_batched(*map(list, zip(stiff, calm)), 1.0, [50, 100])
    assert torch.isnan(both[0].outputs).all() and torch.isfinite(both[1].outputs).all()
    broken = (stiff[0].clone().fill_(float("nan")), *stiff[1:])  # a diverged model's kernel, beside the calm one
    both = evolve_ce_batched(*map(list, zip(broken, calm)), 1.0, [50, 100])
    assert torch.isnan(both[0].outputs).all() and torch.isfinite(both[1].outputs).all()


@pytest.mark.parametrize(
    "algo,extra",
    [
        ("ntk-dfl", ["--kappa", "2"]),
        pytest.param(
            "ntk-dfl", ["--kappa", "2", "--ntk-ode", "adaptive", "--samples-per-peer", "40"], marks=pytest.mark.slow
        ),
        ("ntk-fl", ["--clients-per-round", "0"]),
        ("cp-ntk-fl", ["--ntk-projection", "32"]),
    ],
)
def test_a_learning_rate_far_too_large_ends_the_run_in_one_line(tmp_path, algo, extra):
    """The issue's case (lr 1000 on 4 peers of 20 samples ran for more than 15 minutes in the integrator):
    exit 3, one line, the rows before it kept. A hang fails the test after 2 minutes (faulthandler)."""
    import faulthandler

    from tests.conftest import run_here

    faulthandler.dump_traceback_later(120, exit=True)
    try:
        result = run_here(
            "--algo",
            algo,
            "--dataset",
            "synthetic",
            "--peers",
            "4",
            "--rounds",
            "2",
            "--samples-per-peer",
            "20",
            "--lr",
            "1000",
            "--ntk-taus",
            "100",
            "--no-progress",
            *extra,
            "--out",
            str(tmp_path / "run"),
        )
    finally:
        faulthandler.cancel_dump_traceback_later()
    assert result.returncode == 3, result.stderr[-2000:]
    assert result.stderr.strip().count("\n") == 0 and "have NaN/inf weights; lower --lr" in result.stderr
