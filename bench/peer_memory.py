"""How many peers fit in a GB: the memory a run holds per peer, per model, and what each MPI rank adds.

For each model, two one-round DFedAvg runs of different peer counts on one process; the difference of
their peak memory (the rows' peak_rss_mb, and peak_gpu_mb on a GPU) over the difference of peers is a
peer's share, the rest is the process's base (torch, the data, the model's working set). Then the same
small run on 1 and on 3 MPI ranks (where mpirun exists): what a rank costs on its own.

    python bench/peer_memory.py [--device cpu|cuda] [--only mlp,simple-cnn]

Prints a Markdown table (docs/performance.md holds the CPU's).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from p2pfl.testing import mpirun, run_under_mpirun  # noqa: E402

# Two peer counts a model, far enough apart that the peers' weights (16 bytes a parameter) outweigh the
# allocator's noise in the peak (tens of MiB): at 10 and 60 lenet5 peers the difference is 34 MiB.
MODELS = {"mlp": (30, 300), "simple-cnn": (10, 100), "cnn-fmnist": (10, 100), "lenet5": (10, 200), "resnet8": (10, 100)}
RUN = [
    "--algo",
    "dfedavg",
    "--rounds",
    "1",
    "--lr",
    "0.01",
    "--local-epochs",
    "1",
    "--samples-per-peer",
    "200",
    "--kappa",
    "4",
    "--test-samples",
    "1000",
    "--client-test-samples",
    "1000",
    "--no-progress",
    "--no-tensorboard",
]


def peak(args: list[str], ranks: int = 0) -> tuple[float, float, int]:
    """(peak RSS, peak GPU) in MiB of one run, summed over its ranks, and the model's parameters."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = [*RUN, *args, "--out", f"{tmp}/run"]
        done = (
            run_under_mpirun(argv, ranks, timeout=900)
            if ranks
            else subprocess.run(
                [sys.executable, "-m", "p2pfl.run", *argv], capture_output=True, text=True, cwd=ROOT, timeout=900
            )
        )
        if done.returncode:
            raise SystemExit(f"peer_memory: {' '.join(args)} failed: {done.stderr.strip().splitlines()[-1:]}")
        rows = [json.loads(line) for line in Path(f"{tmp}/run/metrics.jsonl").read_text().splitlines()]
        size = int(re.search(r"([\d,]+) parameters", Path(f"{tmp}/run/config.toml").read_text())[1].replace(",", ""))
    return max(r["peak_rss_mb"] for r in rows), max(r.get("peak_gpu_mb", 0) for r in rows), size


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--only", help=f"comma-separated models (default: {', '.join(MODELS)})")
    a = p.parse_args()
    models = a.only.split(",") if a.only else list(MODELS)
    gpu = a.device != "cpu"
    import torch

    print(f"torch {torch.__version__}, {a.device}")
    print(
        "| model | parameters | peak RSS, MiB (peers) | per peer, MiB of RAM | process base, MiB | peers per GiB of RAM"
        + (" | per peer, MiB of GPU | peers per GiB of GPU |" if gpu else " |")
    )
    print("|---|---|---|---|---|---|" + ("---|---|" if gpu else ""))
    for model in models:
        few, many = MODELS[model]
        (rss_few, gpu_few, size), (rss_many, gpu_many, _) = (
            peak(["--model", model, "--peers", str(n), "--device", a.device]) for n in (few, many)
        )
        per_peer = (rss_many - rss_few) / (many - few)
        peaks = f"{rss_few:,.0f} ({few}), {rss_many:,.0f} ({many})"
        line = (
            f"| {model} | {size:,} | {peaks} | {per_peer:.2f} | {rss_few - few * per_peer:,.0f} | {1024 / per_peer:,.0f} |"
            if per_peer > 0
            else f"| {model} | {size:,} | {peaks} | not measurable: more peers peaked lower | | |"
        )
        if gpu:
            gpu_peer = (gpu_many - gpu_few) / (many - few)
            line += f" {gpu_peer:.2f} | {1024 / gpu_peer:,.0f} |" if gpu_peer > 0 else " | |"
        print(line, flush=True)
    if mpirun():
        one, three = (peak(["--peers", "30", "--device", a.device], ranks)[:2] for ranks in (1, 3))
        print(
            f"\nEach MPI rank: {(three[0] - one[0]) / 2:,.0f} MiB of RAM on its own (30 MLP peers: "
            f"{one[0]:,.0f} MiB on 1 rank, {three[0]:,.0f} MiB summed over 3)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
