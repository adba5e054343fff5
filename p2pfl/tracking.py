"""TensorBoard event files of a run (--tensorboard): every number of each metrics row as a scalar at its
round, in <run folder>/tensorboard. metrics.jsonl stays the record; this is a view of it where
researchers look. Needs the tensorboard package (pip install 'p2pfl-graphsim[tensorboard]')."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from p2pfl.errors import UserError

FOLDER = "tensorboard"


def check_available() -> None:
    if importlib.util.find_spec("tensorboard") is None:
        raise UserError("--tensorboard needs the tensorboard package: pip install 'p2pfl-graphsim[tensorboard]' "
                        "(or pip install tensorboard)")


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
