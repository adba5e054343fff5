"""Does a change of the code change any run's numbers? Every algorithm's tiny run (the conformance suite's)
and a few model, dataset and fault variants, each on one process and on `mpirun -n 3`; run it on two
trees and compare the results (metrics rows without the machine's timings, final.json, model.pt).

    python bench/same_trees.py run /tmp/before        # on the old tree
    python bench/same_trees.py run /tmp/after         # on the new one
    python bench/same_trees.py compare /tmp/before /tmp/after
    python bench/same_trees.py spread /tmp/before /tmp/after   # how far the differing numbers moved

`spread` is for a change meant to move numbers by rounding only (a sum taken in another order or
precision): the largest relative difference of each metric, final.json number and model.pt over every
run, and any value that differs otherwise (a key in one run only, a changed list or text).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from p2pfl import testing  # noqa: E402
from p2pfl.algorithms import REGISTRY  # noqa: E402
from tests.test_conformance import ALGOS, FITS, TINY  # noqa: E402

STAGED = {"tct"}  # its stages fix the rounds


def cases() -> dict[str, list[str]]:
    out = {}
    for algo in ALGOS:
        rounds = [] if algo in STAGED else ["--rounds", "2"]
        out[algo] = [*TINY, *rounds, "--algo", algo, *FITS.get(algo, [])]
        offline = [] if REGISTRY[algo].asynchronous else ["--drop-peers", "0.1"]  # per round: synchronous ones
        out[f"{algo}-faults"] = [*out[algo], "--drop-links", "0.2", *offline]
    fashion = [
        "--dataset",
        "fashion-mnist",
        "--peers",
        "6",
        "--samples-per-peer",
        "40",
        "--test-samples",
        "200",
        "--rounds",
        "2",
        "--local-epochs",
        "1",
        "--seed",
        "5",
        "--no-progress",
    ]
    out.update(
        {
            "dfedavg-cnn-fashion": [*fashion, "--algo", "dfedavg", "--model", "simple-cnn"],
            "ntk-dfl-fashion-batches": [
                *fashion,
                "--algo",
                "ntk-dfl",
                "--ntk-taus",
                "50,100",
                "--ntk-batches",
                "2",
                "--ntk-subsample",
                "2",
            ],
            "ntk-dfl-dense-topk": [*out["ntk-dfl"], "--ntk-jacobian", "dense", "--ntk-topk", "0.5"],
            "dispfl-dirichlet": [*out["dispfl"], "--partition", "dirichlet", "--alpha", "0.3"],
            "dfedavg-linear-rep": [
                *TINY,
                "--rounds",
                "2",
                "--algo",
                "dfedavg",
                "--dataset",
                "linear-rep",
                "--model",
                "linear-rep",
            ],
            "cyclic-moon": [*TINY, "--rounds", "3", "--algo", "cyclic", "--cyclic-rounds", "1", "--then", "moon"],
        }
    )
    return out


def run(root: Path) -> None:
    plan = {name: [*args, "--out", str(root / "one" / name)] for name, args in cases().items()}
    start = time.time()
    for name, args in plan.items():
        result = testing.run_in_process(args)
        if result.returncode:
            print(f"{name}: one process exited {result.returncode}: {result.stderr.strip()[-400:]}")
    print(f"one process: {len(plan)} runs in {time.time() - start:.0f} s")
    start = time.time()
    ranked = {name: [*args, "--out", str(root / "three" / name)] for name, args in cases().items()}
    for name, result in testing.run_many_under_mpirun(ranked, 3, root / "mpirun").items():
        if result.returncode is None:  # the batch ended before this case (a rank killed, say)
            print(f"{name}: mpirun -n 3 did not reach it: {result.stderr.strip()[-400:]}")
        elif result.returncode:
            print(f"{name}: mpirun -n 3 exited {result.returncode}: {result.stderr.strip()[-400:]}")
    print(f"mpirun -n 3: {len(ranked)} runs in {time.time() - start:.0f} s")


def compare(a: Path, b: Path) -> int:
    failures = 0
    for layout in ("one", "three"):
        for name in cases():
            try:
                testing.assert_same_results(a / layout / name, b / layout / name, f"{layout}/{name}")
            except (AssertionError, FileNotFoundError) as exc:
                failures += 1
                print(f"DIFFERENT {layout}/{name}: {str(exc)[:300]}")
    total = 2 * len(cases())
    print(f"{total - failures} of {total} runs give the same metrics, final.json and model.pt")
    return 1 if failures else 0


def relative(x: float, y: float) -> float:
    return abs(x - y) / max(abs(x), abs(y), 1e-30)


def spread(a: Path, b: Path) -> int:
    import torch

    worst: dict[str, float] = {}
    other = []
    for layout in ("one", "three"):
        for name in cases():
            if not all((tree / layout / name / "metrics.jsonl").exists() for tree in (a, b)):
                other.append(f"{layout}/{name}: run in one tree only (a case one tree has not)")
                continue
            first, second = testing.results(a / layout / name), testing.results(b / layout / name)
            finals = first["final"] or {}, second["final"] or {}
            pairs = [(f"final.json {k}", finals[0].get(k), finals[1].get(k)) for k in set(finals[0]) | set(finals[1])]
            for row_a, row_b in zip(first["metrics"], second["metrics"]):
                pairs += [(k, row_a.get(k), row_b.get(k)) for k in set(row_a) | set(row_b)]
            for key, x, y in pairs:
                if isinstance(x, float) and isinstance(y, float):
                    worst[key] = max(worst.get(key, 0.0), relative(x, y))
                elif x != y:
                    other.append(f"{layout}/{name} {key}: {str(x)[:60]} != {str(y)[:60]}")
            models = [run / layout / name / "model.pt" for run in (a, b)]
            if all(m.exists() for m in models):
                sa, sb = (torch.load(m, weights_only=True) for m in models)
                scale = max(float(v.abs().max()) for v in sa.values())  # relative to the model's largest weight
                gap = max(float((sa[k] - sb[k]).abs().max()) for k in sa) / max(scale, 1e-30)
                worst["model.pt"] = max(worst.get("model.pt", 0.0), gap)
    moved = {k: v for k, v in sorted(worst.items()) if v > 0}
    print("largest relative difference by key:", {k: f"{v:.2g}" for k, v in moved.items()} or "none")
    keys = sorted({line.split(": ")[0].split(" ", 1)[-1] for line in other if " " in line.split(": ")[0]})
    print(f"{len(other)} values differ otherwise; their keys: {keys}")
    for line in other[:20]:
        print("DIFFERENT", line)
    return 1 if other else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["run"]:
        run(Path(sys.argv[2]))
    elif sys.argv[1:2] == ["compare"]:
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    elif sys.argv[1:2] == ["spread"]:
        sys.exit(spread(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        sys.exit(__doc__)
