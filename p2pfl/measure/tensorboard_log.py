"""TensorBoard event files of a run (--tensorboard): every number of each metrics row as a scalar at its
round, in <run folder>/tensorboard. metrics.jsonl stays the record; this is a view of it where
researchers look. Needs the tensorboard package (pip install 'p2pfl-graphsim[tensorboard]')."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from p2pfl.errors import UserError

FOLDER = "tensorboard"


def check_available() -> None:
    """Before any work: the package is there and loads (an installed one can fail to, with a broken
    dependency or a protobuf of another version)."""
    if importlib.util.find_spec("tensorboard") is None:
        raise UserError(
            "--tensorboard needs the tensorboard package: pip install 'p2pfl-graphsim[tensorboard]' "
            "(or pip install tensorboard)"
        )
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - whatever breaks the import, it is the package's
        raise UserError(
            f"--tensorboard: the tensorboard package is installed but does not load "
            f"({exc.__class__.__name__}: {str(exc)[:200]}); reinstall it, or run without --tensorboard"
        )


def scalars(row: dict, prefix: str = "") -> dict[str, float]:
    """The row's numbers by name, nested ones as parent/child (bytes_by_phase/average); lists are left out."""
    out: dict[str, float] = {}
    for key, value in row.items():
        if key == "round":
            continue
        if isinstance(value, dict):
            out.update(scalars(value, f"{prefix}{key}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[f"{prefix}{key}"] = float(value)
    return out


class TensorBoardLog:
    def __init__(self, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter  # the optional extra: imported only when asked for

        self.writer = SummaryWriter(log_dir=str(run_dir / FOLDER))

    def add(self, row: dict) -> None:
        for name, value in scalars(row).items():
            self.writer.add_scalar(name, value, row["round"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
