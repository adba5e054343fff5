"""Wall seconds per local step of asynchronous AD-PSGD on the virtual clock beside synchronous D-PSGD, 300 MLP
peers by default, side by side on the same data and starting weights, rounds interleaved in this process:

- D-PSGD: a round is one minibatch step per peer and one averaging with the neighbours;
- AD-PSGD with equal peers (every peer's step 1 s: each takes one step a round, all finishing together,
  trained as one batch), and with step times spread log-normally (sigma 0.5) and a tenth of the peers 10x
  slower, where the steps finish at scattered moments and are trained in several batches a round.

A local step's cost is the round's seconds over the steps its peers finished in it (D-PSGD: one each). The
target: AD-PSGD at most 3x D-PSGD per local step (issue 64), on equal peers and on spread ones.

Usage: python bench/bench_async.py [--peers 300] [--rounds 5] [--dataset fashion-mnist]
"""

import argparse

import torch

from common import load_average, timed
from p2pfl.runner.assemble import build
from p2pfl.runner.configure import make_config, resolve

TARGET = 3.0
CASES = {
    "D-PSGD": {"algo": "dpsgd"},
    "AD-PSGD, equal peers": {"algo": "ad-psgd"},
    "AD-PSGD, spread + 10% 10x slower": {
        "algo": "ad-psgd",
        "step_time": 0.1,
        "step_time_spread": 0.5,
        "slower_peers": 0.1,
        "slower_by": 10.0,
    },
}


def steps_taken(algo) -> int:
    """The local steps the run's peers have started (D-PSGD: none counted here)."""
    return sum(algo.started) if getattr(algo, "started", None) else 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--peers", type=int, default=300)
    p.add_argument("--rounds", type=int, default=5, help="rounds timed per case (the sums are compared)")
    p.add_argument("--dataset", default="fashion-mnist")
    p.add_argument("--samples-per-peer", type=int, default=None)
    args = p.parse_args()
    built = {}
    for name, case in CASES.items():
        values = {"peers": args.peers, "dataset": args.dataset, "progress": False, "model": "mlp", **case}
        if args.samples_per_peer:
            values["samples_per_peer"] = args.samples_per_peer
        built[name] = build(resolve(make_config(values), 1), 0, 1, 0)
    seconds = {name: 0.0 for name in CASES}
    steps = {name: 0 for name in CASES}
    for k in range(args.rounds + 1):  # interleaved: a load that comes and goes hits every case alike
        for name, (ctx, algo) in built.items():
            before = steps_taken(algo)
            took = timed(lambda: algo.round(k), "cpu")
            if k:  # round 1 builds the replica and warms the buffers
                seconds[name] += took
                steps[name] += steps_taken(algo) - before if name != "D-PSGD" else args.peers
    weights = built["D-PSGD"][0].flat.shape[1]
    print(
        f"AD-PSGD beside D-PSGD, {args.peers} MLP peers, {args.dataset}, {weights:,} weights, "
        f"{torch.get_num_threads()} threads, {args.rounds} rounds each; {load_average()}"
    )
    per_step = {name: seconds[name] / max(steps[name], 1) * args.peers for name in CASES}
    base = per_step["D-PSGD"]
    for name in CASES:
        print(
            f"  {name:34s} {seconds[name] / args.rounds:.3f} s a round, {steps[name] / args.peers / args.rounds:.2f} "
            f"steps a peer a round, {per_step[name] * 1e3:.1f} ms per step of every peer, {per_step[name] / base:.2f}x "
            f"D-PSGD (target <= {TARGET:g}x)"
        )


if __name__ == "__main__":
    main()
