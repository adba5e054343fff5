"""Seconds per FedAvg round with TCT's SimpleCNN at CyclicFL's scale: 100 clients on Fashion-MNIST
(NIID-Bench Dirichlet, beta 0.1, 600 samples per client on average), 10 sampled per round, 5 local
epochs, batch 32. The sampled clients as one vmap batch vs one client at a time, measured side by side
in this run on the same data and starting weights. (Runs use one client at a time for conv nets: see
PeerStack; this benchmark is why.)

Usage: python bench/bench_cnn.py [--clients 100] [--per-round 10] [--epochs 5] [--repeats 2]
"""
import argparse
import time

import torch

from p2pfl.config import make_config, resolve
from p2pfl.models import count_parameters
from p2pfl.run import build


def seconds_per_round(batched: bool, args) -> tuple[float, torch.Tensor, int]:
    cfg = resolve(make_config({"algo": "fedavg", "model": "simple-cnn", "dataset": args.dataset,
                               "peers": args.clients, "clients_per_round": args.per_round,
                               "partition": "dirichlet", "dirichlet_style": "per-class", "alpha": 0.1,
                               "samples_per_peer": 600, "local_epochs": args.epochs, "batch_size": 32,
                               "lr": 0.01, "batched": batched, "progress": False}), 1)
    ctx, algo = build(cfg, 0, 1, 0)
    ctx.stack.batched = batched  # conv nets run one client at a time by default; measure vmap anyway
    times = []
    for k in range(args.repeats):
        start = time.perf_counter()
        algo.round(k)
        times.append(time.perf_counter() - start)
    return min(times), ctx.global_weights, count_parameters(ctx.stack.model)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--per-round", type=int, default=10)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--dataset", default="fashion-mnist")
    args = p.parse_args()
    batched, w_batched, params = seconds_per_round(True, args)
    print(f"FedAvg + simple-cnn ({params:,} parameters), {args.clients} clients, {args.per_round} per round, "
          f"{args.epochs} local epochs, batch 32, {torch.get_num_threads()} threads")
    print(f"  batched (vmap over clients): {batched:8.2f} s/round")
    loop, w_loop, _ = seconds_per_round(False, args)
    print(f"  one client at a time:        {loop:8.2f} s/round")
    print(f"  speed-up batched vs loop:    {loop / batched:8.2f}x   "
          f"(max weight difference {float((w_batched - w_loop).abs().max()):.2e})")


if __name__ == "__main__":
    main()
