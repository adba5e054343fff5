"""Sweep one setting over 3 seeds from Python and draw the comparison: the lazy gossip step's --keep.

    python examples/sweep_keep.py [--out runs/sweep-keep] [--rounds 10]

It writes one run folder per (keep, seed) and compare.png, .md and .csv beside them (analysis.compare:
each setting's mean over the seeds with its min-max band).
"""

import argparse
from pathlib import Path

import p2pfl
from analysis.compare import compare
from lazy_gossip import LazyGossip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/sweep-keep")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    out, folders = Path(args.out), []
    for keep in (0.0, 0.5, 0.9):
        for seed in (0, 1, 2):
            folder = out / f"keep={keep}" / f"seed{seed}"
            result = p2pfl.simulate(
                algo=LazyGossip,
                keep=keep,
                seed=seed,
                rounds=args.rounds,
                dataset="synthetic",
                peers=12,
                kappa=3,
                samples_per_peer=60,
                progress=False,
                out=folder,
                overwrite=True,
            )
            print(f"keep {keep} seed {seed}: test accuracy {result.rows[-1]['test_acc']:.3f}")
            folders.append(folder)
    compare(folders, by=["keep"], out=out / "compare.png", title="lazy gossip: the share kept")
    print((out / "compare.md").read_text())
    print(f"figure: {out / 'compare.png'}")


if __name__ == "__main__":
    main()
