"""Does a change of the code change any run's numbers? Every algorithm's tiny run (the conformance suite's)
and a few model, dataset and fault variants, each on one process and on `mpirun -n 3`; run it on two
trees and compare the results (metrics rows without the machine's timings, final.json, model.pt).

    python bench/same_trees.py run /tmp/before        # on the old tree
    python bench/same_trees.py run /tmp/after         # on the new one
    python bench/same_trees.py compare /tmp/before /tmp/after
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from p2pfl import testing  # noqa: E402
from tests.test_conformance import ALGOS, FITS, TINY  # noqa: E402

STAGED = {"tct"}  # its stages fix the rounds


def cases() -> dict[str, list[str]]:
    out = {}
    for algo in ALGOS:
        rounds = [] if algo in STAGED else ["--rounds", "2"]
        out[algo] = [*TINY, *rounds, "--algo", algo, *FITS.get(algo, [])]
        out[f"{algo}-faults"] = [*out[algo], "--drop-links", "0.2", "--drop-peers", "0.1"]
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
        if result.returncode:
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


if __name__ == "__main__":
    if sys.argv[1:2] == ["run"]:
        run(Path(sys.argv[2]))
    elif sys.argv[1:2] == ["compare"]:
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        sys.exit(__doc__)
