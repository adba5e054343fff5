"""What the tools beside the run share: the run's contract for bad input (one line `TOOL: error: ...`,
exit 2, nothing written) and careful readers of run folders and output paths."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tomllib
from pathlib import Path
from typing import Callable

from p2pfl.errors import UserError
from p2pfl.runner import provenance
from p2pfl.runner.paths import SMALL_FILE, checked_path, read_regular


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (UserError), not usage and a message."""

    def error(self, message):
        raise UserError(message)


def guarded(prog: str, body: Callable[[], int]) -> int:
    """body(), with a UserError printed as one line `prog: error: ...` and exit status 2."""
    try:
        return body()
    except UserError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2


def output_file(path: Path, what: str = "--out", suffixes: tuple[str, ...] = (".png", ".pdf", ".svg")) -> Path:
    """A figure path: no suffix gets the first of suffixes (and the caller prints the path as written); an
    existing folder or another suffix is refused."""
    path = checked_path(Path(path), what)
    if path.is_dir():
        raise UserError(f"{what} {path} is a folder; give a file name such as {path / ('figure' + suffixes[0])}")
    if not path.suffix:
        path = path.with_suffix(suffixes[0])
    elif path.suffix.lower() not in suffixes:
        raise UserError(f"{what} {path}: a figure is {', '.join(suffixes)}, not {path.suffix}")
    return path


def output_folder(path: Path, what: str = "--out") -> Path:
    path = checked_path(Path(path), what)
    if path.exists() and not path.is_dir():
        raise UserError(f"{what} {path} is a file; give a folder")
    return path


def writable(path: Path, what: str = "--out") -> None:
    """Make the folder (and its parents) now, so that a place that cannot take files fails before any work."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{what} {path} cannot be made ({exc.strerror or exc.__class__.__name__})")
    if not os.access(path, os.W_OK):
        raise UserError(f"{what} {path} is not writable")


def read_text(path: Path, what: str, limit: int | None = SMALL_FILE) -> str:
    """A regular file's text, or one line saying why not: a named pipe or a device would block the tool,
    a file over `limit` bytes fill its memory, bytes that are not UTF-8 are no text file of p2pfl's."""
    path = Path(path)
    try:
        return read_regular(path, limit).decode("utf-8-sig")
    except FileNotFoundError:
        raise UserError(f"{what} {path} does not exist")
    except IsADirectoryError:
        raise UserError(f"{what} {path} is a folder, not a file")
    except OSError as exc:
        raise UserError(f"{what} {path} cannot be read ({exc.strerror or exc})")
    except UnicodeDecodeError:
        raise UserError(f"{what} {path} is not text (not UTF-8)")


def read_toml(path: Path, what: str) -> dict:
    try:
        return tomllib.loads(read_text(path, what))
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{what} {path} is not valid TOML ({exc})")


def read_json(path: Path, what: str) -> dict:
    """A JSON file holding an object (final.json), or one line."""
    try:
        value = json.loads(read_text(path, what))
    except ValueError:
        raise UserError(f"{what} {path} is not JSON")
    if not isinstance(value, dict):
        raise UserError(f"{what} {path} holds {type(value).__name__}, not an object")
    return value


METRICS_LIMIT = 1 << 30  # a metrics.jsonl of 300 peers' client metrics over thousands of rounds is ~100 MB
MEASURES = ("test_", "bytes_sent", "round_s", "train_loss")  # what the tools read as numbers (test_*: scores)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_rows(path: Path) -> list[dict]:
    """metrics.jsonl's rows, each checked to be a round's row: a JSON object with an integer round."""
    path = Path(path)
    lines = read_text(path, "metrics", METRICS_LIMIT).splitlines()
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise UserError(f"{path} line {number} is not JSON")
        if not isinstance(row, dict) or not isinstance(row.get("round"), int):
            raise UserError(f"{path} line {number} is not a round's row (an object with an integer round)")
        wrong = next((k for k in row if k.startswith(MEASURES) and not _number(row[k])), None)
        if wrong:
            raise UserError(f"{path} line {number}: {wrong} is {row[wrong]!r}, not a number")
        rows.append(row)
    return rows


def provenance_of(config: dict, folder: Path) -> dict:
    """The [p2pfl] table of a run's config.toml (version, commit, machine: strings), taken out of the
    settings, or one line where it is not p2pfl's."""
    table = config.pop(provenance.TABLE, {})
    if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
        raise UserError(f"{folder}/config.toml: its [{provenance.TABLE}] table is not p2pfl's (a table of strings)")
    return table


def read_run(folder: Path) -> tuple[dict, list[dict]]:
    """(config.toml, metrics.jsonl rows) of a run folder, or one line saying why it is not one."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{folder} is not a run folder ({'a file' if folder.exists() else 'nothing is there'})")
    for name in ("config.toml", "metrics.jsonl"):
        if not (folder / name).is_file():
            raise UserError(f"{folder} is not a run folder (no {name})")
    return read_toml(folder / "config.toml", "run config"), read_rows(folder / "metrics.jsonl")
