"""Which p2pfl produced a run, and on what machine: written into every run's config.toml (its [p2pfl]
table), so that a result can be tied to the code and the hardware that gave it."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

from p2pfl import __version__

SOURCE = Path(__file__).resolve().parents[2]  # the checkout, where p2pfl runs from one
TABLE = "p2pfl"  # config.toml's table of these facts; a config read back leaves it out


def commit() -> str:
    """The source's git commit, with '+changes' where tracked files differ from it; 'unknown' outside a
    git checkout (an installed wheel) or without git."""
    if not (SOURCE / ".git").exists():  # a wheel in a virtual environment that sits inside some checkout
        return "unknown"
    try:
        head = _git("rev-parse", "HEAD")
        changed = _git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+changes" if changed else "")


def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(SOURCE), *args], capture_output=True, text=True, timeout=10, check=True)
    return done.stdout.strip()


def cpu_name() -> str:
    """The processor's model name as the OS gives it (Linux: /proc/cpuinfo), else platform's."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(gpus: list[str]) -> str:
    """One line: cores and processor, and the GPUs the run used ('2-core AMD EPYC, no GPU')."""
    used = ", ".join(sorted(set(gpus))) if gpus else "no GPU"
    return f"{os.cpu_count() or 1}-core {cpu_name()}, {used}"


def record(gpus: list[str]) -> dict[str, str]:
    """config.toml's [p2pfl] table."""
    return {"version": __version__, "commit": commit(), "machine": machine(gpus)}
