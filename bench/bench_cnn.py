"""Seconds per FedAvg round with TCT's SimpleCNN: the sampled clients as one vmap batch vs one client at
a time, on the CPU and, where CUDA is present, on the GPU, measured side by side in this run on the
same data and starting weights.

Two scales:
- default, CyclicFL's: 100 clients on Fashion-MNIST (NIID-Bench Dirichlet, beta 0.1, 600 samples per
  client on average), 10 sampled per round, 5 local epochs, batch 32;
- --tct-stage1, TCT's stage 1 at paper scale: 10 clients of 6,000 images, all of them every round,
  5 epochs, batch 64.

Runs take vmap where it is faster: on a GPU, not on the CPU (see PeerStack); this benchmark is why.
Usage: python bench/bench_cnn.py [--clients 100] [--per-round 10] [--epochs 5] [--repeats 2] [--device all]
       [--tct-stage1]
"""

import argparse

import torch

from common import devices, gpu_peak_gb, reset_gpu_peak, timed, load_average
from p2pfl.runner.configure import make_config, resolve
from p2pfl.models import count_parameters
from p2pfl.runner.assemble import build


def seconds_per_round(batched: bool, args, device: str) -> tuple[float, torch.Tensor, int]:
    cfg = resolve(
        make_config(
            {
                "algo": "fedavg",
                "model": "simple-cnn",
                "dataset": args.dataset,
                "peers": args.clients,
                "clients_per_round": args.per_round,
                "partition": "dirichlet",
                "dirichlet_style": "per-class",
                "alpha": 0.1,
                "samples_per_peer": args.samples,
                "local_epochs": args.epochs,
                "batch_size": args.batch,
                "lr": 0.01,
                "batch": batched,
                "device": device,
                "progress": False,
            }
        ),
        1,
    )
    ctx, algo = build(cfg, 0, 1, 0)
    ctx.stack.batched = batched  # conv nets run one client at a time on the CPU; measure vmap anyway
    reset_gpu_peak(device)
    times = [timed(lambda: algo.round(k), device) for k in range(args.repeats)]
    return min(times), ctx.global_weights.cpu(), count_parameters(ctx.stack.model)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--per-round", type=int, default=10)
    p.add_argument("--samples", type=int, default=600, help="samples per client")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--dataset", default="fashion-mnist")
    p.add_argument(
        "--device",
        default="all",
        help="all (the CPU, and the GPU where CUDA is present), gpu (that GPU only), cpu or cuda",
    )
    p.add_argument("--tct-stage1", action="store_true", help="TCT's stage 1 at paper scale (10 x 6,000, batch 64)")
    args = p.parse_args()
    if args.tct_stage1:
        args.clients, args.per_round, args.samples, args.batch = 10, 10, 6000, 64
    print(
        f"FedAvg + simple-cnn, {args.clients} clients of {args.samples} samples, {args.per_round} per round, "
        f"{args.epochs} local epochs, batch {args.batch}, {torch.get_num_threads()} threads"
    )
    reference = None
    for device in devices(args.device):
        batched, w_batched, params = seconds_per_round(True, args, device)
        loop, w_loop, _ = seconds_per_round(False, args, device)
        reference = reference if reference is not None else (loop, w_loop)
        print(
            f"  {device}: vmap over clients {batched:8.2f} s/round, one client at a time {loop:8.2f} s/round "
            f"(vmap {loop / batched:.2f}x; {params:,} parameters){gpu_peak_gb(device)}"
        )
        print(f"  {device}: max weight difference vmap vs loop {float((w_batched - w_loop).abs().max()):.2e}")
        if device != "cpu":
            print(
                f"  {device} vmap against the cpu's one-at-a-time: {reference[0] / batched:.1f}x "
                f"(max weight difference {float((w_batched - reference[1]).abs().max()):.2e})"
            )
    print(f"  {load_average()} at the end")


if __name__ == "__main__":
    main()
