"""Every algorithm x model pair on a device (the GPU by default) for 2 rounds, one OK/FAIL line each with
its time, so that anyone with a GPU can check the whole matrix in a few minutes.

The pairs: every registered algorithm on the MLP, and the pairs whose code paths differ on a GPU: conv
nets (one peer at a time), dropout nets (keyed noise), batch norm (ResNet), NTK with dense Jacobians,
TCT on a CNN. With mpirun present, also 4 ranks sharing the device. Last, a run far too large for the
device must end in one line (exit 2).

Data: a small MNIST-format image set written to a temporary folder (no dataset needed), or the real one
with --data-dir. Usage: python bench/gpu_smoke.py [--device cuda] [--only dfedavg,tct] [--data-dir D] [--jobs 4]
[--results FILE] (one JSON line per pair as it ends: the device check's verdicts, kept if the step is cut)
Without CUDA it says so in one line and skips, instead of failing every pair.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from p2pfl.algorithms import REGISTRY  # noqa: E402
from p2pfl.testing import mpirun  # noqa: E402
from tests.conftest import write_stripes  # noqa: E402

SMALL = [
    "--peers",
    "8",
    "--kappa",
    "3",
    "--samples-per-peer",
    "100",
    "--local-epochs",
    "1",
    "--test-samples",
    "500",
    "--no-progress",
]
FITS = {  # what an algorithm needs to run 2 rounds at this size
    "tct": [
        "--tct-stage1-rounds",
        "1",
        "--tct-stage2-rounds",
        "1",
        "--tct-features",
        "2000",
        "--tct-local-steps",
        "20",
        "--train-samples",
        "1000",
    ],
    "cyclic": ["--cyclic-rounds", "1"],
    "ntk-dfl": ["--ntk-taus", "100,200"],
    "ntk-fl": ["--ntk-taus", "100,200"],
    "cp-ntk-fl": ["--ntk-taus", "100,200"],
    "fedavg-ft": ["--ft-trials", "1"],
}
MODEL_PAIRS = [  # (algo, model, extra flags): code paths the MLP does not take
    ("fedavg", "simple-cnn", []),
    ("dfedavg", "simple-cnn", []),
    ("dfedavg", "cnn-fmnist", []),
    ("dpsgd", "cnn-fmnist", []),
    ("dfedavg", "lenet5", []),
    ("dfedavg", "resnet8", []),
    ("dfedavg", "cnn-femnist", []),
    ("moon", "simple-cnn", []),
    ("dispfl", "simple-cnn", []),
    # dense Jacobians of 147,146 parameters: 6 peers of 10 samples keep them within --ntk-memory-gb
    ("ntk-dfl", "simple-cnn", ["--peers", "6", "--kappa", "2", "--samples-per-peer", "10"]),
    ("tct", "simple-cnn", []),
    ("fedavg-ft", "simple-cnn", []),
]


def pairs(only: set[str] | None) -> list[tuple[str, str, list[str]]]:
    out = [(algo, "mlp", []) for algo in sorted(REGISTRY)] + MODEL_PAIRS
    return [p for p in out if only is None or p[0] in only]


def run(args: list[str], timeout: float, ranks: int = 0) -> tuple[int, str, float]:
    cmd = [sys.executable, "-m", "p2pfl.run", *args]
    if ranks:
        cmd = [mpirun(), "-n", str(ranks), "--oversubscribe", *cmd]
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return -1, f"no result within {timeout:.0f} s", time.perf_counter() - start
    return done.returncode, done.stderr, time.perf_counter() - start


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:160] if lines else ""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--only", help="comma-separated algorithms (default: all)")
    p.add_argument("--data-dir", help="a folder with MNIST-format IDX files (default: a small one is written)")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--jobs", type=int, default=1, help="pairs run at once (they share the GPU)")
    p.add_argument("--results", help="a file to append one JSON line per pair to, as each ends")
    a = p.parse_args()
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print(
            f"gpu-smoke: no CUDA device here (torch {torch.__version__} sees none): nothing to check on "
            f"--device {a.device} (skipped)"
        )
        return 0
    only = set(a.only.split(",")) if a.only else None
    failures = 0

    def record(name: str, ok: bool, seconds: float, err: str) -> None:
        print(f"{'OK  ' if ok else 'FAIL'} {name} {seconds:6.1f} s  {last_line(err)}", flush=True)
        if a.results:
            with open(a.results, "a") as f:
                f.write(
                    json.dumps({"pair": name, "ok": ok, "seconds": round(seconds, 1), "last": last_line(err)}) + "\n"
                )

    with tempfile.TemporaryDirectory() as tmp:
        data = a.data_dir or str(write_stripes(Path(tmp), 10, 3000, 600))
        common = ["--dataset", "mnist", "--data-dir", data, "--device", a.device, *SMALL]
        cases = [
            (
                f"{algo:10s} {model:11s}",
                [*common, "--algo", algo, "--model", model, *FITS.get(algo, []), *extra, "--rounds", "2"],
                0,
            )
            for algo, model, extra in pairs(only)
        ]
        if mpirun() and (only is None or "dfedavg" in only):
            cases.append(
                (
                    "dfedavg    mlp, mpirun -n 4 sharing the device",
                    [*common, "--algo", "dfedavg", "--rounds", "2", "--peers", "40"],
                    4,
                )
            )

        def one(i):
            name, args, ranks = cases[i]
            return (name, *run([*args, "--out", f"{tmp}/run{i}"], a.timeout, ranks))

        with ThreadPoolExecutor(max(1, a.jobs)) as pool:  # printed in order, as each is known
            for name, code, err, seconds in pool.map(one, range(len(cases))):
                ok = code == 0
                failures += not ok
                record(name.strip(), ok, seconds, err)
        if only is None:  # far too large: must be refused in one line, never a CUDA traceback
            code, err, seconds = run(
                [
                    *common,
                    "--algo",
                    "dfedavg",
                    "--model",
                    "resnet18",
                    "--peers",
                    "3000",
                    "--samples-per-peer",
                    "1",
                    "--rounds",
                    "1",
                    "--out",
                    f"{tmp}/too-large",
                ],
                a.timeout,
            )
            ok = code == 2 and err.count("\n") <= 1 and "Traceback" not in err
            failures += not ok
            record("too large: resnet18, 3000 peers on one rank, refused in one line", ok, seconds, err)
    print(f"{len(cases) + (only is None) - failures} OK, {failures} FAIL on --device {a.device}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
