"""Every run an experiment preset would start, whichever launch tool reads its shape: a [baseline]
is a FedAvg-FT study (launch.fedavg_ft), [columns] a table (launch.table), neither the NTK-DFL figures
(launch.figures)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from launch import fedavg_ft, figures, table


def experiment_runs(path: Path, out: Path) -> list[dict]:
    """Each run's folder under out, command line ("argv") and, where the tool names them, its "method",
    "column" and "lr"."""
    values = tomllib.loads(path.read_text())
    if "baseline" in values:
        return fedavg_ft.runs_of(values, out)
    if "columns" in values:
        return table.runs_of(values, list(values["columns"]), out)
    return figures.plan(values, out)
