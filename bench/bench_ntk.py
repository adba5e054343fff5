"""NTK-DFL benchmarks, measured side by side in one run.

1. (printed last) Seconds per round at 300 peers (kappa 5, Fashion-MNIST alpha 0.1, ~200 samples per
   peer, 8 candidate t), and the job's peak memory: a real `python -m p2pfl.run` child (under mpirun
   with --ranks > 1), round time from its metrics.jsonl (train_s: the round without its evaluation),
   peak memory the sum of the ranks' peak RSS; on the CPU and, where CUDA is present (--device all), on the GPU with one process.
2. One peer's evolution step on the same neighbourhood, factored vs dense Jacobians (Jacobian, kernel,
   evolution, candidates, selection), and the largest difference between the weights they pick. Then
   the neighbourhood's kernel as one product, by blocks, by blocks with the peers' inputs Grams given,
   and with the inputs as 8-bit pixel codes (integer products); its candidates' losses by vmap, by
   batched products and with the pixel codes; their weights (J^T S) in float32 and with the codes.
3. The CE evolution methods on that neighbourhood against a tight ODE solution (float64 Runge-Kutta,
   quarter steps): time per peer step and the largest relative error of a candidate's weight update;
   then the default's SSPRK(4,3) steps against RK3's, on that kernel and on it made as stiff as
   trained ones.
4. Every neighbourhood's evolution of a round as one batch of products (a GPU run's path): its time on
   each device, and one of them against the tight solution.

Usage: python bench/bench_ntk.py [--peers 300] [--samples 200] [--rounds 2] [--ranks 1,2] [--skip-round] [--skip-dense]
       [--device all]
"""

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor

import p2pfl  # noqa: F401  (first: it keeps numpy's BLAS on one thread, which torch's import would start)
import torch

from common import devices, gpu_peak_gb, reset_gpu_peak, run_rounds, timed, load_average
from p2pfl.runner.configure import make_config, resolve
from p2pfl.ntk import DenseJacobian, FactoredJacobian
from p2pfl.models import MLPShape
from p2pfl.ntk import evolution
from p2pfl.ntk.batched_evolution import evolve_ce_batched
from p2pfl.ntk.evolution import evolve_ce, tight_ce_sums
from p2pfl.ntk import pixels as pixel_codes
from p2pfl.ntk.pixels import PixelInputs
from p2pfl.ntk.step import ntk_step
from p2pfl.runner.assemble import build
from p2pfl.local.forward import candidate_losses


def ntk_config(args):
    """The run these measurements take their neighbourhoods from, on the CPU."""
    values = {"algo": "ntk-dfl", "peers": args.peers, "kappa": 5, "alpha": 0.1, "progress": False, "device": "cpu"}
    return resolve(make_config({**values, **({"samples_per_peer": args.samples} if args.samples else {})}), 1)


def round_seconds(args, ranks: int, device: str = "cpu") -> float:
    """A real run's rounds; returns its fastest round's seconds."""
    rows, total = run_rounds(
        [
            "--algo",
            "ntk-dfl",
            "--peers",
            str(args.peers),
            "--kappa",
            "5",
            "--alpha",
            "0.1",
            "--rounds",
            str(args.rounds),
            "--device",
            device,
            *(["--samples-per-peer", str(args.samples)] if args.samples else []),
        ],
        ranks,
    )
    peak = max(r["peak_rss_mb"] for r in rows) / 1024  # summed over ranks by the run itself
    gpu = max((r.get("peak_gpu_mb", 0) for r in rows), default=0) / 1024
    for r in rows:
        print(
            f"  round {r['round']}: {r['train_s']:.2f} s (aggregated accuracy {100 * r['test_acc']:.1f}%, "
            f"sent {r['bytes_sent'] / 1e6:.0f} MB, dense-equivalent {r['bytes_dense'] / 1e9:.0f} GB, "
            f"t chosen {r.get('ntk_t_hist')})"
        )
    print(
        f"  whole job {total:.0f} s with start-up and evaluation; peak memory {peak:.2f} GB"
        + (f", peak GPU memory {gpu:.2f} GB" if gpu else "")
    )
    return min(r["train_s"] for r in rows)


def batched_evolutions(args, device: str) -> None:
    """The evolutions of every neighbourhood of round 1 as one batch on the device (what a GPU run does),
    timed; and one of them against the tight ODE solution and against the CPU's split method."""
    cfg = ntk_config(args)
    ctx, _ = build(cfg, 0, 1, 0)  # on the CPU: the kernels are made there and moved to device
    graph, shape = ctx.schedule.graph(0), MLPShape.of(ctx.stack.model, ctx.stack.layout)
    count = args.peers if device != "cpu" else 2  # on the CPU this path is slow by design: two for the check
    kernels, f0s, targets = [], [], []
    for peer in range(count):
        index = torch.cat([ctx.shards[j] for j in sorted(list(graph.neighbors(peer)) + [peer])])
        jac, f0 = FactoredJacobian.compute(shape, ctx.flat[peer], ctx.data.train_x[index])
        kernels.append(jac.kernel(shape, ctx.flat[peer]).to(device))
        f0s.append(f0.to(device))
        targets.append(torch.nn.functional.one_hot(ctx.data.train_y[index], 10).float().to(device))
    taus, eta = list(cfg.settings.ntk_taus), 0.01
    reset_gpu_peak(device)
    seconds = min(timed(lambda: evolve_ce_batched(kernels, f0s, targets, eta, taus), device) for _ in range(2))
    print(
        f"  {device}: {count} neighbourhoods (up to {max(len(k) for k in kernels)} samples) evolved as one batch "
        f"in {seconds:.3f} s{gpu_peak_gb(device)}"
    )
    H, f0, Y = kernels[0].cpu(), f0s[0].cpu(), targets[0].cpu()
    truth = tight_ce_sums(H, f0, Y, eta, taus)
    batched = evolve_ce_batched(kernels[:1], f0s[:1], targets[:1], eta, taus)[0].residual_sums.cpu().double()
    split = evolve_ce(H, f0, Y, eta, taus).residual_sums.double()
    off = {
        name: float(((s - truth).norm(dim=(1, 2)) / truth.norm(dim=(1, 2))).max())
        for name, s in (("batched", batched), ("split", split))
    }
    print(
        f"  peer 0's residual sums against the tight solution: batched off by {off['batched']:.1e}, "
        f"split (the CPU's) by {off['split']:.1e}"
    )


def one_step(ctx, path: str, peer: int = 0):
    cfg = ctx.cfg
    graph = ctx.schedule.graph(0)
    hood = sorted(list(graph.neighbors(peer)) + [peer])
    index = torch.cat([ctx.shards[j] for j in hood]).to(ctx.device)
    x, y = ctx.data.train_x[index], ctx.data.train_y[index]
    w = ctx.flat[0]
    shape = MLPShape.of(ctx.stack.model, ctx.stack.layout)
    settings = cfg.settings.step_settings()

    def network_loss(cands):
        return candidate_losses(ctx.stack, cands, x, y)

    start = time.perf_counter()
    if path == "factored":
        jac, f0 = FactoredJacobian.compute(shape, w, x)
    else:
        jac, f0 = DenseJacobian.compute(ctx.stack.model, ctx.stack.layout, w, x)
    with torch.no_grad():
        result = ntk_step(jac, shape, w, f0, y, ctx.data.n_classes, ctx.lr(0), settings, network_loss)
    return time.perf_counter() - start, result, len(y)


def factored_vs_dense(args) -> None:
    cfg = ntk_config(args)
    ctx, _ = build(cfg, 0, 1, 0)
    fac_s, fac, n = one_step(ctx, "factored")
    fac_s = min(fac_s, one_step(ctx, "factored")[0])
    print(f"  neighbourhood of peer 0: {n} samples, {len(cfg.settings.ntk_taus)} candidates")
    print(f"  factored: {fac_s:8.3f} s per peer step")
    if args.skip_dense:
        return
    dense_s, dense, _ = one_step(ctx, "dense")
    print(
        f"  dense:    {dense_s:8.3f} s per peer step (dense Jacobian {n * 10 * ctx.stack.layout.size * 4 / 1e9:.1f} GB)"
    )
    print(
        f"  speed-up factored vs dense: {dense_s / fac_s:.0f}x; same t picked: {fac.tau == dense.tau}; "
        f"max weight difference {float((fac.weights - dense.weights).abs().max()):.1e}"
    )


def alternating(variants: dict, repeats: int = 10) -> dict:
    """Best seconds of each variant, timed in turn (noise on a shared machine hits them alike)."""
    best = {name: float("inf") for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def kernel_and_selection(args) -> None:
    """Peer 0's neighbourhood kernel as one product, by blocks (its upper block triangle), by blocks with
    each peer's inputs Gram given, and by blocks with the inputs as pixel codes (NTK-DFL's default on
    Fashion-MNIST: it keeps the codes across neighbourhoods and rounds); its 8 candidates' losses by vmap
    of functional_call, by the batched MLP products and with the codes; their weights likewise."""
    cfg = ntk_config(args)
    ctx, _ = build(cfg, 0, 1, 0)
    hood = sorted(list(ctx.schedule.graph(0).neighbors(0)) + [0])
    w, shape = ctx.flat[0], MLPShape.of(ctx.stack.model, ctx.stack.layout)
    parts = [FactoredJacobian.compute(shape, w, ctx.data.train_x[ctx.shards[j]])[0] for j in hood]
    stacked = FactoredJacobian.cat(parts)
    given = FactoredJacobian.cat(parts, [part.input_gram() for part in parts])
    single = FactoredJacobian(stacked.acts, stacked.gates)
    index = torch.cat([ctx.shards[j] for j in hood])
    x, y = ctx.data.train_x[index], ctx.data.train_y[index]
    if pixel_codes.int8_products_fast():
        print("  this CPU has 8-bit dot-product instructions: runs take the pixel codes")
    else:
        print("  this CPU lacks 8-bit dot-product instructions: runs take float32 products (the codes timed anyway)")
    pixels = PixelInputs.encode(x, ctx.data.pixel_levels, where_slow=True)
    coded = FactoredJacobian.cat(parts, pixels=pixels)
    kernels = {
        "one product": lambda: single.kernel(shape, w),
        "by blocks": lambda: stacked.kernel(shape, w),
        "by blocks, inputs Grams given": lambda: given.kernel(shape, w),
        "by blocks, pixel codes": lambda: coded.kernel(shape, w),
    }
    best = alternating(kernels)
    for name, seconds in best.items():
        print(f"  kernel {name:30s} {1000 * seconds:6.1f} ms ({best['one product'] / seconds:.2f}x)")
    wide = FactoredJacobian([a.double() for a in stacked.acts], [g.double() for g in stacked.gates])
    exact = wide.kernel(shape, w.double())
    errors = {
        name: float((jac.kernel(shape, w).double() - exact).abs().max() / exact.abs().max())
        for name, jac in (("one product", single), ("Grams given", given), ("pixel codes", coded))
    }
    print(
        "  kernels' largest error against float64 (relative to the largest entry): "
        + ", ".join(f"{name} {error:.1e}" for name, error in errors.items())
    )
    cands = w + 0.01 * torch.randn(len(cfg.settings.ntk_taus), len(w), generator=torch.Generator().manual_seed(0))

    def by_vmap():
        outputs = ctx.stack.forward(cands, x, shared_input=True)
        return ctx.stack.task.losses(outputs, y.expand(len(cands), *y.shape)).mean(1)

    best = alternating(
        {
            "vmap": by_vmap,
            "batched products": lambda: candidate_losses(ctx.stack, cands, x, y),
            "pixel codes": lambda: candidate_losses(ctx.stack, cands, x, y, pixels=pixels),
        }
    )
    gap = float((by_vmap() - candidate_losses(ctx.stack, cands, x, y)).abs().max())
    coded_gap = float((candidate_losses(ctx.stack, cands, x, y, pixels=pixels) - by_vmap()).abs().max())
    print(
        f"  {len(cands)} candidates' losses on {len(y)} samples: vmap {1000 * best['vmap']:.1f} ms, batched "
        f"products {1000 * best['batched products']:.1f} ms ({best['vmap'] / best['batched products']:.2f}x), "
        f"pixel codes {1000 * best['pixel codes']:.1f} ms ({best['vmap'] / best['pixel codes']:.2f}x); "
        f"largest difference from vmap {gap:.1e} and {coded_gap:.1e}"
    )
    S = torch.randn(len(cands), len(y), ctx.data.n_classes, generator=torch.Generator().manual_seed(1))
    best = alternating(
        {
            "float32": lambda: stacked.transpose_apply(shape, w, S),
            "pixel codes": lambda: coded.transpose_apply(shape, w, S),
        }
    )
    exact = wide.transpose_apply(shape, w.double(), S.double())
    errors = {
        name: float((jac.transpose_apply(shape, w, S).double() - exact).abs().max() / exact.abs().max())
        for name, jac in (("float32", stacked), ("pixel codes", coded))
    }
    print(
        f"  {len(cands)} candidates' J^T S: float32 {1000 * best['float32']:.1f} ms, pixel codes "
        f"{1000 * best['pixel codes']:.1f} ms ({best['float32'] / best['pixel codes']:.2f}x); largest error against "
        f"float64 {errors['float32']:.1e} and {errors['pixel codes']:.1e} (relative to the largest entry)"
    )


def ode_methods(args) -> None:
    cfg = ntk_config(args)
    ctx, _ = build(cfg, 0, 1, 0)
    graph = ctx.schedule.graph(0)
    hood = sorted(list(graph.neighbors(0)) + [0])
    index = torch.cat([ctx.shards[j] for j in hood])
    x, y = ctx.data.train_x[index], ctx.data.train_y[index]
    w, shape, taus, eta = ctx.flat[0], MLPShape.of(ctx.stack.model, ctx.stack.layout), list(cfg.settings.ntk_taus), 0.01
    jac, f0 = FactoredJacobian.compute(shape, w, x)
    H, Y = jac.kernel(shape, w), torch.nn.functional.one_hot(y, ctx.data.n_classes).float()

    def update(sums):
        return (eta / len(y)) * jac.transpose_apply(shape, w, sums.float()).double()

    start = time.perf_counter()
    truth = update(tight_ce_sums(H, f0, Y, eta, taus))
    print(f"  tight reference: {time.perf_counter() - start:6.2f} s ({len(y)} samples, t = {taus[0]}..{taus[-1]})")
    for method in ("split", "adaptive", "deflated", "euler"):
        seconds = []
        for _ in range(3):
            start = time.perf_counter()
            evo = evolve_ce(H, f0, Y, eta, taus, method)
            seconds.append(time.perf_counter() - start)
        error = float(((update(evo.residual_sums) - truth).norm(dim=1) / truth.norm(dim=1)).max())
        print(
            f"  {method:9s} {1000 * min(seconds):6.0f} ms per peer step, weight update off by {error:.1e}"
            f"{'  (default)' if method == cfg.settings.ntk_ode else ''}"
        )
    evolution_threads(H, f0, Y, eta, taus)
    ssprk_vs_rk3(H, f0, Y, eta, taus, update)


def ssprk_vs_rk3(H, f0, Y, eta, taus, update, rates=(None, 6.0, 7.0)) -> None:
    """split's SSPRK(4,3) steps against RK3's, side by side, alternating: on the kernel as it is (a step
    of two units against one of one) and with its top eigenvalue raised to rates of trained
    neighbourhoods (eta lambda_max / N 4 to 9 after 25 rounds; at 6 two steps for three units against
    six, at 7 one step of one unit against two)."""
    lam, V = torch.linalg.eigh(H.double())
    n = len(Y)
    for rate in rates:
        kernel = H
        if rate is not None:
            kernel = (H.double() + (rate * n / eta - lam[-1]) * torch.outer(V[:, -1], V[:, -1])).float()
        truth = update(tight_ce_sums(kernel, f0, Y, eta, taus))
        x = float(lam[-1]) * eta / n if rate is None else rate
        print(f"  eta lambda_max / N = {x:.1f}" + (" (raised)" if rate is not None else ""))
        best, errors = {True: float("inf"), False: float("inf")}, {}
        for _ in range(3):
            for wide in (True, False):
                evolution.SPLIT_WIDE = wide
                start = time.perf_counter()
                evo = evolve_ce(kernel, f0, Y, eta, taus, "split")
                best[wide] = min(best[wide], time.perf_counter() - start)
                errors[wide] = float(((update(evo.residual_sums) - truth).norm(dim=1) / truth.norm(dim=1)).max())
        evolution.SPLIT_WIDE = True
        for wide in (True, False):
            print(
                f"    split, {'SSPRK(4,3) (default)' if wide else 'RK3':20s} {1000 * best[wide]:4.0f} ms, "
                f"weight update off by {errors[wide]:.1e}"
            )
        print(f"    SSPRK(4,3) vs RK3: {best[False] / best[True]:.2f}x faster")


def evolution_threads(H, f0, Y, eta, taus, count: int = 8) -> None:
    """The default evolution is compiled code without the GIL: evolutions on a rank's threads should
    scale with its cores (numpy's small calls made two threads slower than one)."""
    threads = max(1, (os.cpu_count() or 1))
    evolve_ce(H, f0, Y, eta, taus)
    start = time.perf_counter()
    for _ in range(count):
        evolve_ce(H, f0, Y, eta, taus)
    alone = time.perf_counter() - start
    with ThreadPoolExecutor(threads) as pool:
        start = time.perf_counter()
        list(pool.map(lambda _: evolve_ce(H, f0, Y, eta, taus), range(count)))
        pooled = time.perf_counter() - start
    print(
        f"  {count} default evolutions: {alone:.2f} s one after another, {pooled:.2f} s on {threads} threads "
        f"({alone / pooled:.2f}x)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--peers", type=int, default=300)
    p.add_argument("--rounds", type=int, default=2, help="rounds per timed run (round 1 includes warm-up)")
    p.add_argument("--ranks", default="1,2", help="MPI rank counts to time the round with, comma-separated")
    p.add_argument("--samples", type=int, help="samples per peer (default p2pfl's 200; fewer: a quick try)")
    p.add_argument("--skip-round", action="store_true")
    p.add_argument("--skip-dense", action="store_true")
    p.add_argument(
        "--device",
        default="all",
        help="all (the CPU, and the GPU where CUDA is present), gpu (that GPU only), cpu or cuda",
    )
    args = p.parse_args()
    on = devices(args.device)
    print(f"NTK-DFL step on one neighbourhood ({torch.get_num_threads()} threads)")
    factored_vs_dense(args)
    print("Kernel and candidate selection of one neighbourhood, side by side")
    kernel_and_selection(args)
    print("CE evolution methods vs a tight ODE solution (one neighbourhood, lr 0.01)")
    ode_methods(args)
    print("A rank's evolutions as one batch of products (the GPU's path)")
    for device in on:
        batched_evolutions(args, device)
    if not args.skip_round:
        seconds = {}
        for device in on:
            for ranks in (int(r) for r in args.ranks.split(",")) if device == "cpu" else (1,):
                print(
                    f"NTK-DFL round on {device}: {args.peers} peers on {ranks} rank(s), kappa 5, Fashion-MNIST "
                    "alpha 0.1, 200 samples per peer"
                )
                seconds[device, ranks] = round_seconds(args, ranks, device)
        if ("cuda", 1) in seconds:
            print(f"  fastest round, cuda against cpu (1 rank each): {seconds['cpu', 1] / seconds['cuda', 1]:.1f}x")
    print(f"  {load_average()} at the end")


if __name__ == "__main__":
    main()
