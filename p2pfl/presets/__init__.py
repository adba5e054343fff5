"""The shipped presets, found by name from any folder. A run preset (this folder) is one run's settings,
for `--config NAME`, `launch.sweep NAME` and `analysis topology NAME`; an experiment (experiments/) is
a table or figure of several runs, for the launch tool that reads its shape.

    python -m p2pfl.presets     # every preset: name, what runs it, what it is, its file
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from p2pfl.errors import UserError

RUNS = Path(__file__).resolve().parent
EXPERIMENTS = RUNS / "experiments"
LIST_COMMAND = "python -m p2pfl.presets"


@dataclass(frozen=True)
class Preset:
    name: str
    path: Path
    runner: str  # the command that takes it
    purpose: str  # its first comment sentence


def launch_tool(experiment: dict) -> str:
    """The launch tool that reads an experiment, by its shape: one with a [baseline] is a FedAvg-FT study
    (fedavg_ft), one with [columns] a table (table), one with neither the NTK-DFL figures (figures)."""
    return "fedavg_ft" if "baseline" in experiment else "table" if "columns" in experiment else "figures"


def runner_of(path: Path) -> str:
    """The command that takes a preset: launch's tool for an experiment, p2pfl.run for one run's."""
    if path.parent != EXPERIMENTS:
        return "python -m p2pfl.run --config"
    return f"python -m launch.{launch_tool(tomllib.loads(path.read_text()))}"


def purpose_of(path: Path) -> str:
    """The preset's opening comment up to its first sentence's end (at most 140 characters)."""
    words = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        words.append(line.lstrip("#").strip())
    text = " ".join(words)
    end = text.find(". ")
    text = text if end < 0 else text[: end + 1]
    return text if len(text) <= 140 else text[:139].rstrip() + "…"


def presets() -> list[Preset]:
    files = sorted(RUNS.glob("*.toml")) + sorted(EXPERIMENTS.glob("*.toml"))
    return [Preset(p.stem, p, runner_of(p), purpose_of(p)) for p in files]


def path_of(name: str) -> Path | None:
    """The shipped preset of that name (a run preset first, then an experiment), or None."""
    return next((p for p in (RUNS / f"{name}.toml", EXPERIMENTS / f"{name}.toml") if p.is_file()), None)


def find(given: str | Path, kind: str = "run") -> Path:
    """A TOML file as given where one is there; else, for a bare name, the shipped preset of that name
    ('.toml' optional).
    kind: 'run' (one run's settings) or 'experiment'. A preset of the other kind is refused naming the
    command that takes it."""
    path = Path(given)
    if path.is_file():
        return path
    name = path.name.removesuffix(".toml")
    if str(path) in (name, f"{name}.toml"):  # a bare name, not a path to a missing file
        shipped = path_of(name)
        if shipped is None:
            raise UserError(f"{given}: no such file, and no preset of that name ({LIST_COMMAND} lists them)")
        if (shipped.parent == EXPERIMENTS) != (kind == "experiment"):
            raise UserError(
                f"{given} is {'an experiment' if kind == 'run' else 'a run preset'}: {runner_of(shipped)} {name}"
            )
        return shipped
    return path  # the caller's reading says what is wrong with it


def listing() -> str:
    rows = presets()
    width = max(len(p.name) for p in rows)
    lines = []
    for title, experiment in (("Run presets", False), ("Experiments", True)):
        lines.append(f"{title}:")
        for p in rows:
            if (p.path.parent == EXPERIMENTS) == experiment:
                lines.append(f"  {p.name:<{width}}  {p.runner} {p.name}\n  {'':<{width}}  {p.purpose}")
        lines.append("")
    lines.append(f"Files: {RUNS}")
    return "\n".join(lines)
