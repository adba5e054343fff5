"""How long each paper-scale experiment takes on this machine, and how much memory it holds.

Each case runs a few rounds of the experiment's method at the paper's scale, times a round's training
and its evaluation apart (the rows' train_s and eval_s, medians from round 2 on), and extrapolates to
the experiment's rounds and evaluation schedule: total = rounds x (round_s - eval_s) + evaluated rounds
x eval_s. Peak memory is the run's own peak_rss_mb (and peak_gpu_mb on a GPU).

    python bench/paper_times.py [--device cpu|cuda|auto] [--only ntk-dfl,dfedavg] [--rounds 3]

Prints a Markdown table (docs/performance.md holds the CPU's). TCT's stage 1 is FedAvg on its 10 clients;
its stage 2 (the linearized model) is not timed here, nor FedAvg-FT's fine-tuning trials after the last round.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launch.table import flags  # noqa: E402

# name: (preset or experiment file, the experiment's method (None: a run preset), extra flags)
CASES = {
    "ntk-dfl": ("p2pfl/presets/ntk-dfl-fmnist300.toml", None, []),
    "dfedavg": ("p2pfl/presets/dfedavg-fmnist300.toml", None, []),
    "dfedavgm": ("p2pfl/presets/dfedavgm-fmnist300.toml", None, []),
    "cp-ntk-fl": ("p2pfl/presets/cp-ntk-fl-fmnist300.toml", None, []),
    "ntk-fl": ("p2pfl/presets/cp-ntk-fl-fmnist300.toml", None, ["--algo", "ntk-fl"]),
    "dispfl": ("p2pfl/presets/experiments/dispfl-fmnist-paper.toml", "dispfl", []),
    "tct stage 1": ("p2pfl/presets/experiments/tct-fmnist-paper.toml", "fedavg", ["--lr", "0.01", "--rounds", "100"]),
    "cyclicfl (fl phase)": ("p2pfl/presets/experiments/cyclic-fmnist-paper.toml", "fedavg", []),
    "fedavg-ft (training)": (
        "p2pfl/presets/experiments/fedavg-ft-fmnist-paper.toml",
        "fedavg",
        ["--algo", "fedavg-ft"],
    ),
}


def settings_of(path: str, method: str | None, extra: list[str]) -> tuple[list[str], int, int]:
    """The case's flags (an experiment's first column), and the full experiment's rounds and evaluation
    interval."""
    text = tomllib.loads((ROOT / path).read_text())
    if method:  # an experiment: its common settings, its first column's (the data split), the method's
        column = next(iter(text.get("columns", {}).values()), {})
        merged = {**text.get("common", {}), **column, **text[method]}
    else:
        merged = dict(text)
    merged.pop("lrs", None)
    merged.pop("label", None)
    argv = flags(merged) + extra
    rounds = int(extra[extra.index("--rounds") + 1]) if "--rounds" in extra else int(merged.get("rounds", 20))
    return argv, rounds, int(merged.get("eval-every", 1))


def measure(name: str, device: str, rounds: int, timeout: float) -> dict:
    path, method, extra = CASES[name]
    argv, total_rounds, every = settings_of(path, method, extra)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            "-m",
            "p2pfl.run",
            *argv,
            "--rounds",
            str(rounds),
            "--eval-every",
            "1",
            "--device",
            device,
            "--no-progress",
            "--no-tensorboard",
            "--checkpoint-every",
            "0",
            "--out",
            f"{tmp}/run",
        ]
        start = time.perf_counter()
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        except subprocess.TimeoutExpired:
            return {"name": name, "error": f"over {timeout:.0f} s"}
        if done.returncode:
            return {"name": name, "error": (done.stderr.strip().splitlines() or ["?"])[-1]}
        rows = [json.loads(line) for line in Path(f"{tmp}/run/metrics.jsonl").read_text().splitlines()]
    later = rows[1:] or rows
    med = {k: statistics.median(r[k] for r in later) for k in ("train_s", "eval_s", "round_s")}
    evaluated = math.ceil(total_rounds / every)
    total = total_rounds * (med["round_s"] - med["eval_s"]) + evaluated * med["eval_s"]
    return {
        "name": name,
        "rounds": total_rounds,
        "evaluated": evaluated,
        **med,
        "total_s": total,
        "rss_mb": max(r.get("peak_rss_mb", 0) for r in rows),
        "gpu_mb": max((r.get("peak_gpu_mb", 0) for r in rows), default=0),
        "wall_s": time.perf_counter() - start,
    }


def hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--only", help=f"comma-separated cases (default all: {', '.join(CASES)})")
    p.add_argument("--rounds", type=int, default=3, help="rounds run per case (default 3; the first is left out)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per case (default 600)")
    a = p.parse_args()
    names = a.only.split(",") if a.only else list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        p.error(f"unknown case(s) {unknown}; choose from {list(CASES)}")
    print(
        "| experiment (paper scale) | rounds (evaluated) | training, s a round | evaluation, s an evaluated round "
        "| whole run, estimated | peak RSS, MiB | peak GPU, MiB |"
    )
    print("|---|---|---|---|---|---|---|")
    for name in names:
        r = measure(name, a.device, a.rounds, a.timeout)
        if "error" in r:
            print(f"| {name} | failed: {r['error']} | | | | | |", flush=True)
            continue
        gpu = f"{r['gpu_mb']:,.0f}" if r["gpu_mb"] else "-"
        print(
            f"| {name} | {r['rounds']} ({r['evaluated']}) | {r['round_s'] - r['eval_s']:.2f} | {r['eval_s']:.2f} "
            f"| {hours(r['total_s'])} | {r['rss_mb']:,.0f} | {gpu} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
