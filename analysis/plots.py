"""Figures that compare runs; a run's own figures are drawn by the core (p2pfl.report)."""
from __future__ import annotations

from pathlib import Path

from p2pfl.report import finish, plot_final_averaging, plt, save

__all__ = ["finish", "plot_comparison", "plot_final_averaging", "plt", "save"]


def plot_comparison(runs: dict[str, list[dict]], path: Path, key: str = "test_acc", target: float | None = None,
                    title: str = "") -> None:
    """One curve per run (label -> metrics rows)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, rows in runs.items():
        rows = [r for r in rows if key in r]
        ax.plot([r["round"] for r in rows], [100 * r[key] for r in rows], label=label)
    if target is not None:
        ax.axhline(100 * target, color="grey", ls="--", lw=0.8)
    finish(fig, ax, path, "round", f"{key} (%)", title)
