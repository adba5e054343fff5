"""Every run an experiment preset would start, by the launch tool that reads its shape
(p2pfl.presets.launch_tool)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from launch import fedavg_ft, figures, table
from p2pfl import presets


def experiment_runs(path: Path, out: Path) -> list[dict]:
    """Each run's folder under out, command line ("argv") and, where the tool names them, its "method",
    "column" and "lr"."""
    values = tomllib.loads(path.read_text())
    tool = presets.launch_tool(values)
    if tool == "fedavg_ft":
        return fedavg_ft.runs_of(values, out)
    if tool == "table":
        return table.runs_of(values, list(values["columns"]), out)
    return figures.plan(values, out)
