"""A trade-off figure from a launch.table results.json: one curve per series of methods, the final value of
one metric (y, test_acc by default) against another (x, e.g. a privacy epsilon), mean and standard
deviation over the table's columns (seeds).

python -m analysis tradeoff RESULTS.json --series "LABEL=GLOB:X_METRIC" [--series ...] [--y test_acc]
    [--out FILE] [--title T]

e.g. --series "local DP=noise-*:dp_epsilon" --series "Muffliato=muffliato-*:dp_epsilon_network"
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import statistics
from pathlib import Path

from analysis.plots import AGGREGATED, finish, is_fraction, metric_label, plt


def series_points(results: dict, pattern: str, x: str, y: str) -> list[tuple[float, float, float, float]]:
    """(x mean, y mean, x sd, y sd) over the columns for each method matching pattern, sorted by x; a
    method without x or y in some column is left out (one line on stderr would hide nothing: it is absent)."""
    methods = sorted({m for column in results.values() for m in column if fnmatch.fnmatch(m, pattern)})
    points = []
    for method in methods:
        cells = [column.get(method) or {} for column in results.values()]
        xs = [c.get(x) for c in cells]
        ys = [c.get(y) for c in cells]
        if any(v is None for v in xs + ys):
            continue
        spread = lambda v: statistics.stdev(v) if len(v) > 1 else 0.0
        points.append((statistics.mean(xs), statistics.mean(ys), spread(xs), spread(ys)))
    return sorted(points)


def plot_tradeoff(curves: dict[str, list[tuple]], path: Path, x: str, y: str, title: str = "") -> None:
    """One curve per label with error bars; x on a log scale where it spans more than a factor of 10."""
    scale = 100 if is_fraction(y) else 1
    fig, ax = plt.subplots(figsize=(7, 4.5))
    values = []
    for (label, points), marker in zip(curves.items(), "osD^v<>"):
        xs, ys, xe, ye = zip(*points)
        values += xs
        ax.errorbar(
            xs,
            [scale * v for v in ys],
            xerr=xe,
            yerr=[scale * v for v in ye],
            fmt=AGGREGATED,
            marker=marker,
            capsize=3,
            label=label,
        )
    if values and min(values) > 0 and max(values) / min(values) > 10:
        ax.set_xscale("log")
    finish(fig, ax, path, x.replace("_", " "), metric_label(y), title, per_round=False)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis tradeoff", description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="a launch.table results.json")
    parser.add_argument("--series", action="append", required=True, help="LABEL=GLOB:X_METRIC")
    parser.add_argument("--y", default="test_acc")
    parser.add_argument("--out", type=Path, default=None, help="default: tradeoff.png beside the results")
    parser.add_argument("--title", default="")
    args = parser.parse_args(argv)
    results = json.loads(args.results.read_text())
    curves, xs = {}, set()
    for spec in args.series:
        label, _, rest = spec.partition("=")
        pattern, _, x = rest.rpartition(":")
        if not (label and pattern and x):
            parser.error(f"--series takes LABEL=GLOB:X_METRIC, got {spec!r}")
        points = series_points(results, pattern, x, args.y)
        if not points:
            parser.error(f"--series {spec!r}: no method matching {pattern!r} has {x} and {args.y} in every column")
        curves[label] = points
        xs.add(x)
    out = args.out or args.results.with_name("tradeoff.png")
    plot_tradeoff(curves, out, " or ".join(sorted(xs)), args.y, args.title)
    for label, points in curves.items():
        print(label + ": " + ", ".join(f"({px:.3g}, {py:.4g})" for px, py, _, _ in points))
    print(f"wrote {out}")
    return 0
