"""Seconds per D-PSGD round at 32 peers, dense and with each gossip codec (the change since the public
copies: top-1%, top-10%, 4-bit QSGD), side by side on the same data and starting weights:

- the algorithm's round alone (one minibatch step and the gossip), rounds interleaved in this process;
- the whole round of a run (`python -m p2pfl.run`, its round_s: training, gossip, the round's metrics and
  its evaluation, every round as by default), each codec's run in turn.

QSGD draws a uniform number for every weight from each sender's key (2.5 million a round here, about
15 ms on 2 cores, near a dense step's whole time), so the algorithm-only ratio stays above 2x where the
step is one minibatch; the whole round's is the time a researcher waits.

Usage: python bench/bench_codecs.py [--peers 32] [--rounds 5] [--dataset fashion-mnist]
"""

import argparse
import os

import torch

from common import load_average, run_rounds, timed
from p2pfl.runner.assemble import build
from p2pfl.runner.configure import make_config, resolve

CODECS = {
    "dense": {},
    "top-1%": {"gossip_topk": 0.01},
    "top-10%": {"gossip_topk": 0.1},
    "qsgd-4": {"gossip_quant_bits": 4},
}
QSGD_TARGET = 2.0  # a QSGD round at most this many times a dense one


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--peers", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5, help="rounds timed per codec (the best is reported)")
    p.add_argument("--dataset", default="fashion-mnist")
    p.add_argument("--samples-per-peer", type=int, default=None)
    p.add_argument("--codecs", default=",".join(CODECS), help=f"comma-separated, of {', '.join(CODECS)}")
    args = p.parse_args()
    chosen = {name: CODECS[name] for name in args.codecs.split(",")}
    if "dense" not in chosen or "qsgd-4" not in chosen:
        p.error("--codecs needs dense and qsgd-4 (the ratio the bench is for)")
    built = {}
    for name, codec in chosen.items():
        values = {"algo": "dpsgd", "peers": args.peers, "static": True, "dataset": args.dataset, "progress": False}
        if args.samples_per_peer:
            values["samples_per_peer"] = args.samples_per_peer
        built[name] = build(resolve(make_config({**values, **codec}), 1), 0, 1, 0)
    times = {name: [] for name in chosen}
    for k in range(args.rounds + 1):  # interleaved: a load that comes and goes hits every codec alike
        for name, (ctx, algo) in built.items():
            seconds = timed(lambda: algo.round(k), "cpu")
            if k:  # round 1 warms the codec's buffers
                times[name].append(seconds)
    weights = built["dense"][0].flat.shape[1]
    print(
        f"D-PSGD, {args.peers} peers, {args.dataset}, {weights:,} weights, {torch.get_num_threads()} threads; "
        f"{load_average()}"
    )
    dense = min(times["dense"])
    for name, seconds in times.items():
        print(f"  {name:8s} {min(seconds):.3f} s a round (best of {len(seconds)}), {min(seconds) / dense:.2f}x dense")
    whole = {}
    for name, codec in chosen.items():
        flags = [f"--{k.replace('_', '-')}={v}" for k, v in codec.items()]
        extra = ["--samples-per-peer", str(args.samples_per_peer)] if args.samples_per_peer else []
        rows, _ = run_rounds(
            [
                "--algo",
                "dpsgd",
                "--peers",
                str(args.peers),
                "--static",
                "--dataset",
                args.dataset,
                "--rounds",
                str(args.rounds + 1),
                *extra,
                *flags,
            ]
        )
        whole[name] = sorted(r["round_s"] for r in rows[1:])[len(rows[1:]) // 2]  # the median, round 1 left out
    print(f"whole rounds of a run (round_s, median of {args.rounds}; load average now {os.getloadavg()[0]:.2f}):")
    for name, seconds in whole.items():
        print(f"  {name:8s} {seconds:.3f} s a round, {seconds / whole['dense']:.2f}x dense")
    for what, ratio in (
        ("the algorithm's round", min(times["qsgd-4"]) / dense),
        ("a run's whole round", whole["qsgd-4"] / whole["dense"]),
    ):
        print(
            f"QSGD 4-bit, {what}: {ratio:.2f}x dense ({'within' if ratio <= QSGD_TARGET else 'over'} {QSGD_TARGET:g}x)"
        )


if __name__ == "__main__":
    main()
