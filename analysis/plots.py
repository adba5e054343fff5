"""Figures that compare runs; a run's own figures are drawn by the core (p2pfl.measure.figures)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from p2pfl.measure.metrics import METRICS
from p2pfl.measure.figures import (
    AGGREGATED,
    MEAN_CLIENT,
    finish,
    plot_final_averaging,
    plt,
    save,
    target_line,
    whole_numbers,
)

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
    """One curve per run (label -> metrics rows) of the metric key, solid; on a log scale where the values
    are positive and span more than 3 orders of magnitude (a gradient norm going to an optimum)."""
    scale = 100 if is_fraction(key) else 1
    fig, ax = plt.subplots(figsize=(7, 4.5))
    values = []
    for label, rows in runs.items():
        rows = [r for r in rows if r.get(key) is not None]
        values += [scale * r[key] for r in rows]
        ax.plot([r["round"] for r in rows], [scale * r[key] for r in rows], AGGREGATED, label=label)
    if values and min(values) > 0 and max(values) / min(values) > 1e3:
        ax.set_yscale("log")
    if target is not None:
        target_line(ax, scale * target, f"target {scale * target:g}{'%' if scale == 100 else ''}")
    label = metric_label(key)
    finish(fig, ax, path, "round", label if len(label) <= 65 else textwrap.fill(label, 45), title)  # long: 2 lines


def _metric(key: str):
    import p2pfl.algorithms  # noqa: F401 - the algorithms declare their own metrics

    return next((m for m in METRICS.values() if key in m.keys), None)


def is_fraction(key: str) -> bool:
    metric = _metric(key)
    return metric is not None and metric.unit.startswith("fraction") and "loss" not in key


def metric_label(key: str) -> str:
    """An axis label from the metric's declaration: what it measures, in words, and its unit
    ('accuracy (%): the aggregated model on the whole test set')."""
    metric = _metric(key)
    if metric is None:
        return key
    quantity = "accuracy" if "acc" in key else "loss" if "loss" in key else key.replace("_", " ")
    head, _, rest = metric.meaning.partition(": ")
    meaning = rest if rest and len(head) < 30 else metric.meaning  # past a short scope ("classification: ")
    what = re.split(r"[:;]|, | \(", meaning)[0].strip()
    units = [u.split(" (")[0].strip() for u in metric.unit.split(";")]
    unit = "%" if is_fraction(key) else (units[-1] if "loss" in key else units[0])
    return f"{quantity} ({unit}): {what}"


def plot_table(cells: dict[str, dict[str, float | None]], path: Path, key: str = "test_acc", title: str = "") -> None:
    """A result table (method -> column -> final value) as a heat map, each cell written in it; a cell
    without a value (a run that did not finish) is grey and says so. Higher is darker for an accuracy."""
    import numpy as np

    methods, columns = list(cells), list(dict.fromkeys(c for row in cells.values() for c in row))
    scale = 100 if is_fraction(key) else 1
    values = np.array([[np.nan if cells[m].get(c) is None else scale * cells[m][c] for c in columns] for m in methods])
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(columns) + 2), max(2.5, 0.55 * len(methods) + 1.8)))
    shown = np.ma.masked_invalid(values)
    cmap = plt.get_cmap("viridis").with_extremes(bad="0.85")
    image = ax.imshow(shown, cmap=cmap, aspect="auto")
    for i in range(len(methods)):
        for j in range(len(columns)):
            v = values[i, j]
            text = "did not\nfinish" if np.isnan(v) else (f"{v:.1f}" if scale == 100 else f"{v:.3g}")
            dark = not np.isnan(v) and v < np.nanmin(values) + 0.6 * (np.nanmax(values) - np.nanmin(values))
            ax.text(j, i, text, ha="center", va="center", fontsize=8, color="white" if dark else "black")
    ax.set_xticks(range(len(columns)), [textwrap.fill(c, 12) for c in columns], rotation=0, fontsize=8)
    ax.set_yticks(range(len(methods)), methods, fontsize=9)
    fig.colorbar(image, ax=ax, label=metric_label(key) if len(metric_label(key)) <= 40 else key, fraction=0.03)
    if title:
        ax.set_title(textwrap.fill(title, 110), fontsize=10)
    save(fig, path)
