"""Seconds per DFedAvg round at 300 peers: the rank's peers trained together (batched products) vs a per-peer loop.

Both are measured in this one run, on the same data and starting weights, so the ratio is fair on a
shared, noisy machine. Usage: python bench/bench_dfedavg.py [--peers 300] [--epochs 20] [--repeats 1]
"""
import argparse
import time

import torch

from p2pfl.config import make_config, resolve
from p2pfl.metrics import peak_rss_kib
from p2pfl.run import build


def seconds_per_round(batched: bool, args) -> tuple[float, torch.Tensor]:
    cfg = resolve(make_config({"algo": "dfedavg", "peers": args.peers, "kappa": 5, "alpha": 0.1,
                               "dataset": args.dataset, "local_epochs": args.epochs, "batched": batched,
                               "progress": False}), 1)
    ctx, algo = build(cfg, 0, 1, 0)
    times = []
    for k in range(args.repeats):
        start = time.perf_counter()
        algo.round(k)
        times.append(time.perf_counter() - start)
    return min(times), ctx.flat


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--peers", type=int, default=300)
    p.add_argument("--epochs", type=int, default=20, help="local epochs per round (DFedAvg default 20)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--dataset", default="fashion-mnist")
    args = p.parse_args()
    print(f"DFedAvg, {args.peers} peers, kappa 5, alpha 0.1, batch 25, {args.epochs} local epochs, "
          f"{torch.get_num_threads()} threads")
    batched, w_batched = seconds_per_round(True, args)
    print(f"  batched (peers together):  {batched:8.2f} s/round")
    loop, w_loop = seconds_per_round(False, args)
    print(f"  per-peer loop:             {loop:8.2f} s/round")
    print(f"  speed-up batched vs loop:  {loop / batched:8.2f}x   "
          f"(max weight difference {float((w_batched - w_loop).abs().max()):.2e})")
    print(f"  peak memory of this process (both runs): {peak_rss_kib() / 2**20:.2f} GB")


if __name__ == "__main__":
    main()
