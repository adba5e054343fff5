"""Rounds to a target accuracy, several algorithms side by side on the same data and graph seed.

    python launch/rounds_to_target.py --peers 300 --rounds 30 --algos ntk-dfl,dfedavg --target 0.85
    python launch/rounds_to_target.py --ranks 4 ...      # each run under mpirun -n 4 --oversubscribe

Writes OUT/<algo>/ (the usual run folders), OUT/comparison.png and OUT/summary.json, and prints for
each algorithm the first round whose aggregated model reaches the target, and the gap between the
aggregated model and the mean client at the last round (NTK-DFL paper fig. 2 and fig. 4).
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis.plots import plot_comparison  # noqa: E402
from launch.table import mpi_prefix  # noqa: E402
from analysis.toolkit import read_rows  # noqa: E402
from p2pfl.measure.metrics import rounds_to_target  # noqa: E402


def run(algo: str, args, out: Path) -> list[dict]:
    cmd = [
        sys.executable,
        "-m",
        "p2pfl.run",
        "--algo",
        algo,
        "--peers",
        str(args.peers),
        "--rounds",
        str(args.rounds),
        "--kappa",
        str(args.kappa),
        "--alpha",
        str(args.alpha),
        "--dataset",
        args.dataset,
        "--seed",
        str(args.seed),
        "--out",
        str(out),
        *args.extra,
    ]
    cmd = [*mpi_prefix(args.ranks), *cmd]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    subprocess.run(cmd, check=True, cwd=ROOT, env=env)
    return read_rows(out / "metrics.jsonl")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algos", default="ntk-dfl,dfedavg")
    p.add_argument("--peers", type=int, default=300)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--kappa", type=float, default=5)
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--dataset", default="fashion-mnist")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", type=float, default=0.85)
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--out", default="runs/rounds-to-target")
    p.add_argument("extra", nargs="*", help="more p2pfl flags for every run (after --)")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs, summary = {}, {}
    for algo in args.algos.split(","):
        rows = runs[algo] = run(algo, args, out / algo)
        last = [r for r in rows if "test_acc" in r][-1]
        summary[algo] = {
            "rounds_to_target": rounds_to_target(rows, args.target),
            "final_test_acc": last["test_acc"],
            "final_client_acc_mean": last["client_acc_mean"],
            "aggregated_minus_mean_client": last["test_acc"] - last["client_acc_mean"],
            "seconds_per_round": sum(r["round_s"] for r in rows) / len(rows),
        }
    plot_comparison(
        runs,
        out / "comparison.png",
        target=args.target,
        title=f"{args.dataset}, {args.peers} peers, kappa {args.kappa:g}, alpha {args.alpha:g}",
    )
    (out / "summary.json").write_text(
        json.dumps({"target": args.target, "settings": vars(args), "algos": summary}, indent=1)
    )
    print(f"target {100 * args.target:.0f}% aggregated test accuracy, {args.peers} peers:")
    for algo, s in summary.items():
        reached = s["rounds_to_target"] or f"not within {args.rounds}"
        print(
            f"  {algo:10s} rounds to target: {reached};  last round: aggregated {100 * s['final_test_acc']:.2f}%, "
            f"mean client {100 * s['final_client_acc_mean']:.2f}% (gap {100 * s['aggregated_minus_mean_client']:+.2f} "
            f"points); {s['seconds_per_round']:.1f} s/round"
        )


if __name__ == "__main__":
    main()
