"""What a round's evaluation costs beside its training, with the client test subset and with every test
sample, measured side by side in one run.

FedAvg with the default MLP, 200 samples and 5 local epochs per client, every client every round (the
workload of the comparison with Flower's simulation engine), at 100 and 300 clients: a real
`python -m p2pfl.run` child per setting, its rows' train_s, eval_s and round_s averaged over the rounds
after the first, and the largest client_acc_se (how far the subset's mean client accuracy may be from
the whole test set's).

    python bench/bench_eval.py [--clients 100,300] [--rounds 6] [--device cpu]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import load_average, run_rounds  # noqa: E402


def mean(rows: list[dict], key: str) -> float:
    return sum(r[key] for r in rows) / len(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", default="100,300")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--device", default="cpu")
    p.add_argument("--subset", type=int, default=None, help="--client-test-samples (default: p2pfl's)")
    args = p.parse_args()
    print("evaluation beside training, FedAvg, MLP, 200 samples x 5 epochs a client, all clients a round:")
    for clients in [int(c) for c in args.clients.split(",")]:
        flags = [
            "--algo",
            "fedavg",
            "--peers",
            str(clients),
            "--clients-per-round",
            str(clients),
            "--samples-per-peer",
            "200",
            "--rounds",
            str(args.rounds),
            "--device",
            args.device,
        ]
        subset = [] if args.subset is None else ["--client-test-samples", str(args.subset)]
        for name, extra in (("client subset", subset), ("every test sample", ["--client-test-samples", "0"])):
            rows = run_rounds(flags + extra)[0][1:]  # round 1 holds one-off costs
            se = max((r.get("client_acc_se", 0.0) for r in rows), default=0.0)
            print(
                f"  {clients} clients, {name}: training {mean(rows, 'train_s'):.2f} s, evaluation "
                f"{mean(rows, 'eval_s'):.2f} s ({mean(rows, 'eval_s') / mean(rows, 'train_s'):.2f}x the training), "
                f"round {mean(rows, 'round_s'):.2f} s; largest client_acc_se {100 * se:.2f} points"
            )
    print(f"  {load_average()} at the end")


if __name__ == "__main__":
    main()
