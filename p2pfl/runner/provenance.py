"""Which p2pfl produced a run, and on what machine: written into every run's config.toml (its [p2pfl]
table), so that a result can be tied to the code and the hardware that gave it."""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import tomllib
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


def file_digest(path: Path) -> str:
    """The SHA-256 of a file's content, read in blocks (a graph or partition file may be large)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def input_digests(cfg) -> dict[str, str]:
    """{setting: its file's SHA-256} of each file the run reads beside its data (topology_file,
    partition_file), as the run started: config.toml's [p2pfl] table keeps them (as topology_file_sha256),
    and a resume or a tool that reads the file again (analysis topology) refuses one changed since."""
    named = ("topology_file", "partition_file", "step_time_file", "availability_file")
    return {name: file_digest(Path(getattr(cfg, name))) for name in named if getattr(cfg, name) is not None}


def record(gpus: list[str], cfg) -> dict[str, str]:
    """config.toml's [p2pfl] table."""
    inputs = {f"{name}_sha256": digest for name, digest in input_digests(cfg).items()}
    return {"version": __version__, "commit": commit(), "machine": machine(gpus), **inputs}


def changed_input(table: dict, cfg) -> str | None:
    """The flag and path of an input file whose content is not the one config.toml's [p2pfl] table
    records (a run folder written before 0.3.0 records none); None when all are."""
    now = input_digests(cfg)
    for name, digest in now.items():
        recorded = table.get(f"{name}_sha256")
        if recorded is not None and recorded != digest:
            return f"--{name.replace('_', '-')} {getattr(cfg, name)}"
    return None


def recorded(config: Path) -> dict:
    """A run's config.toml's [p2pfl] table ({} where it holds none, or none that is a table)."""
    try:
        table = tomllib.loads(Path(config).read_text(encoding="utf-8-sig")).get(TABLE, {})
    except (OSError, ValueError):
        return {}
    return table if isinstance(table, dict) else {}
