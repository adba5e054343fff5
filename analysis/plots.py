"""Figures that compare runs; a run's own figures are drawn by the core (p2pfl.report)."""

from __future__ import annotations

from pathlib import Path

from p2pfl.report import AGGREGATED, MEAN_CLIENT, finish, plot_final_averaging, plt, save, target_line, whole_numbers

__all__ = [
    "AGGREGATED",
    "MEAN_CLIENT",
    "finish",
    "plot_comparison",
    "plot_final_averaging",
    "plt",
    "save",
    "target_line",
    "whole_numbers",
]


def plot_comparison(
    runs: dict[str, list[dict]], path: Path, key: str = "test_acc", target: float | None = None, title: str = ""
) -> None:
    """One curve per run (label -> metrics rows): the aggregated model, solid."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, rows in runs.items():
        rows = [r for r in rows if key in r]
        ax.plot([r["round"] for r in rows], [100 * r[key] for r in rows], AGGREGATED, label=label)
    if target is not None:
        target_line(ax, 100 * target, f"target {100 * target:g}%")
    finish(fig, ax, path, "round", f"{key} (%)", title)
