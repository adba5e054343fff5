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
