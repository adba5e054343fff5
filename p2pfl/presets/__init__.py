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


PRESET_LIMIT = 1 << 20  # a preset is a few kB


def text_of(path: Path) -> str:
    """A preset file's text, or one line naming it: a folder, a pipe (which would block), a dangling link,
    a huge or non-UTF-8 file among the presets is no preset."""
    if not path.is_file():
        raise UserError(f"preset {path} is not a file (a folder, a pipe or a link to nothing): remove it")
    try:
        if path.stat().st_size > PRESET_LIMIT:
            raise UserError(f"preset {path} holds {path.stat().st_size:,} bytes; a preset is a few kB")
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"preset {path} cannot be read ({getattr(exc, 'strerror', None) or exc.__class__.__name__})")


def runner_of(path: Path) -> str:
    """The command that takes a preset: launch's tool for an experiment, p2pfl.run for one run's."""
    if path.parent != EXPERIMENTS:
        return "python -m p2pfl.run --config"
    try:
        return f"python -m launch.{launch_tool(tomllib.loads(text_of(path)))}"
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"preset {path} is not valid TOML ({exc})")


def purpose_of(path: Path) -> str:
    """The preset's opening comment up to its first sentence's end (at most 140 characters)."""
    words = []
    for line in text_of(path).splitlines():
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
    return next(
        (p for p in (RUNS / f"{name}.toml", EXPERIMENTS / f"{name}.toml") if p.exists() or p.is_symlink()), None
    )


def find(given: str | Path, kind: str = "run") -> Path:
    """A TOML file as given where one is there; else, for a bare name, the shipped preset of that name
    ('.toml' optional).
    kind: 'run' (one run's settings) or 'experiment'. A preset of the other kind is refused naming the
    command that takes it."""
    path = Path(given)
    if str(given) == "":
        raise UserError("--config is empty: give a TOML file or a preset's name (python -m p2pfl.presets lists them)")
    try:
        if path.is_file():
            return path
        path_of(path.name.removesuffix(".toml"))
    except OSError as exc:  # a name too long for the file system
        shown = str(given) if len(str(given)) <= 60 else f"{str(given)[:60]}... ({len(str(given))} characters)"
        raise UserError(f"--config {shown}: {exc.strerror or exc}")
    name = path.name.removesuffix(".toml")
    if str(path) in (name, f"{name}.toml"):  # a bare name, not a path to a missing file
        shipped = path_of(name)
        if shipped is None:
            raise UserError(f"{given}: no such file, and no preset of that name ({LIST_COMMAND} lists them)")
        if (shipped.parent == EXPERIMENTS) != (kind == "experiment"):
            raise UserError(
                f"{given} is {'an experiment' if kind == 'run' else 'a run preset'}: {runner_of(shipped)} {name}"
            )
        text_of(shipped)  # one line where the preset file is broken
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
