"""Compare run folders: which method, at what cost, with what spread over seeds.

    python -m analysis compare RUN_DIR... [--by algo] [--target 0.8,0.85] [--band minmax|std] [--out FILE]

Runs whose settings are equal but for the seed form a group, drawn as the mean over its runs with a
min-max (or +-1 std) band: test accuracy against rounds, against bytes sent and against wall time, the
aggregated model solid and the mean client dotted. A table (Markdown and CSV) gives each group's final
accuracy and the rounds and bytes it took to reach each target. Only config.toml, metrics.jsonl and
final.json (its spectral gap) of each folder are read.
"""

from __future__ import annotations

import csv
import functools
import math
import os
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from matplotlib.ticker import MaxNLocator

from analysis.plots import AGGREGATED, MEAN_CLIENT, plt, target_line, whole_numbers
from analysis.toolkit import Parser, guarded, output_file, provenance_of, read_json, read_run
from p2pfl.errors import UserError

# Settings that do not change a run's numbers: never a reason to split groups.
NOT_RESULTS = {
    "seed",
    "progress",
    "device",
    "comm_timeout",
    "checkpoint_every",
    "save_edges",
    "batch",
    "batched",
    "resume",
    "tensorboard",
    "client_test_samples",
}
MIB = 2**20
BYTES_SPREAD = 20  # groups whose bytes sent differ more than this: the bytes axis is drawn on a log scale


@dataclass
class Run:
    folder: Path
    config: dict
    rows: list[dict]
    source: dict = field(default_factory=dict)  # config.toml's [p2pfl]: version, commit, machine
    final_gap: float | None = None  # final.json's spectral_gap: a time-varying family's period rate

    @property
    def made_by(self) -> str:
        """'0.2.0 (fad828e6a62)': the p2pfl that wrote the run ('unrecorded' before versions were)."""
        if not self.source:
            return "unrecorded"
        return f"{self.source.get('version', '?')} ({self.source.get('commit', '?')[:11]})"

    def curve(self, key: str) -> dict[int, float]:
        return {r["round"]: r[key] for r in self.rows if key in r and r[key] is not None}

    def final(self, key: str) -> float:
        """The metric at the last round that has it."""
        curve = self.curve(key)
        return curve[max(curve)]

    def cumulative(self, key: str) -> dict[int, float]:
        """Running sum of a per-round field (bytes_sent, round_s), by round."""
        total, out = 0.0, {}
        for r in self.rows:
            total += r.get(key, 0.0) if key != "round_s" else round_seconds(r)
            out[r["round"]] = total
        return out

    @property
    def training_time_only(self) -> bool:
        """A run from before rows held round_s: its times leave out evaluation."""
        return any("round_s" not in r for r in self.rows)


def round_seconds(row: dict) -> float:
    """A round's whole time, evaluation included: round_s; rows written before it existed hold only the
    training time, wall_s."""
    return row.get("round_s", row.get("wall_s", 0.0))


@dataclass
class Group:
    label: str
    runs: list[Run] = field(default_factory=list)
    settings: list[str] = field(default_factory=list)  # those that tell the groups apart (the label's)
    also: list[str] = field(default_factory=list)  # settings that differ between groups but are not in the label
    mixed: list[str] = field(default_factory=list)  # settings that differ among this group's own runs

    def value(self, key: str) -> str:
        """A setting's value in this group's runs, or 'mixed' where they differ."""
        values = {_short(run.config.get(key)) for run in self.runs}
        return values.pop() if len(values) == 1 else "mixed"

    def gap(self) -> float | None:
        """The runs' spectral gap: final.json's where every run has one (the rate of one period's product
        for a graph that changes by design, as the one-peer exponential graph), else the mean over their
        rows' (None: a star, no graph rows)."""
        if all(run.final_gap is not None for run in self.runs):
            return float(np.mean([run.final_gap for run in self.runs]))
        gaps = [row["spectral_gap"] for run in self.runs for row in run.rows if "spectral_gap" in row]
        return float(np.mean(gaps)) if gaps else None

    def legend(self) -> str:
        gap = self.gap()
        return f"{self.label}{'' if gap is None else f', gap {gap:.3g}'} (n={len(self.runs)})"

    @property
    def timed(self) -> bool:
        """Whether every run has the virtual clock's sim_time_s in every row (runs before it have not)."""
        return all(run.rows and all("sim_time_s" in r for r in run.rows) for run in self.runs)

    def rounds(self, key: str) -> list[int]:
        """Rounds at which every run of the group has the metric."""
        common = set.intersection(*(set(run.curve(key)) for run in self.runs))
        return sorted(common)

    def stack(self, key: str, rounds: list[int], cumulative: bool = False) -> np.ndarray:
        """(runs, rounds) values of a metric, or of a running sum."""
        curves = [run.cumulative(key) if cumulative else run.curve(key) for run in self.runs]
        return np.array([[c[k] for k in rounds] for c in curves], dtype=float)


def load_run(folder: Path) -> Run:
    config, rows = read_run(folder)
    if not any("test_acc" in r or "test_loss" in r for r in rows):
        every = config.get("eval_every")
        raise UserError(
            f"{folder} has no evaluated round yet ({len(rows)} rounds done"
            f"{f', --eval-every {every}' if isinstance(every, int) and every > 1 else ''})"
        )
    final = read_json(Path(folder) / "final.json", "final") if (Path(folder) / "final.json").exists() else {}
    gap = final.get("spectral_gap")
    return Run(Path(folder), config, rows, provenance_of(config, folder), gap if isinstance(gap, int | float) else None)


def group_runs(runs: list[Run], by: list[str] | None) -> list[Group]:
    """by: the settings that name a group (seeds and everything else pooled); None: every setting that
    changes the numbers, labelled by those that differ between groups."""
    if by:
        unknown = [k for k in by if not any(k in run.config for run in runs)]
        if unknown:
            raise UserError(f"--by {','.join(unknown)} is not a setting in any config.toml")
        keys = by
    else:
        keys = sorted({k for run in runs for k in run.config} - NOT_RESULTS)
    for run in runs:  # a run older than a setting ran as its default does
        run.config = {**{k: v for k, v in setting_defaults(run.config.get("algo")).items() if k in keys}, **run.config}
    groups: dict[tuple, Group] = {}
    for run in runs:
        groups.setdefault(tuple(_same(run.config.get(k)) for k in keys), Group("")).runs.append(run)
    varying = keys if by else label_keys(runs, keys)
    shared = [
        k for k in sorted({k for run in runs for k in run.config} - NOT_RESULTS) if all(k in r.config for r in runs)
    ]
    also = [k for k in shared if k not in varying and len({_same(r.config.get(k)) for r in runs}) > 1]
    also = [k for k in also if not all(own_default(run, k) for run in runs)]  # each algorithm's own: fair
    for group in groups.values():
        config = group.runs[0].config
        group.settings, group.also = list(varying), also
        group.mixed = [k for k in shared if len({_same(r.config.get(k)) for r in group.runs}) > 1]
        named = [k for k in varying if config.get(k) is not None]  # a setting its algorithm lacks says nothing
        told = [k for k in named if k == "algo" or by or not own_default(group.runs[0], k)] or named  # nor a default
        group.label = ", ".join(f"{k}={_short(config.get(k))}" for k in told) or str(config.get("algo", "runs"))
    return list(groups.values())


RUN_LEVEL = ("peers", "rounds", "dataset", "model")  # what a comparison holds fixed, whatever its defaults


def own_default(run: Run, key: str) -> bool:
    """Whether the run's value of a setting is its algorithm's default for it (not a run-level one): a
    training setting (lr, batch size, local epochs...) or the mixing each algorithm sets its own way, at its
    default, is a fair comparison, as a paper runs each method with its own settings."""
    defaults = setting_defaults(run.config.get("algo"))
    return key not in RUN_LEVEL and key in defaults and _same(run.config.get(key)) == _same(defaults[key])


def relabel(groups: list[Group], labels: str | None) -> None:
    """--labels folder: each group by its runs' folder (the one that holds them all, for several seeds);
    --labels A,B,...: by name, in the groups' order."""
    if labels is None:
        return
    if labels == "folder":
        for group in groups:
            common = Path(os.path.commonpath([str(run.folder.resolve()) for run in group.runs]))
            group.label = common.name if len(group.runs) == 1 or common.parent != common else str(common)
        return
    names = [name.strip() for name in labels.split(",")]
    if len(names) != len(groups):
        raise UserError(
            f"--labels names {len(names)} groups, and the runs form {len(groups)}: "
            + "; ".join(group.label for group in groups)
        )
    for group, name in zip(groups, names):
        group.label = name


def caveats(groups: list[Group]) -> list[str]:
    """What makes the comparison less than like with like, a line each: settings in which the groups differ
    beside their label (a setting each algorithm sets its own way: peers, rounds, lr), and groups whose own
    runs differ in something other than their seed."""
    lines = []
    if groups[0].also:
        lines.append(
            "the groups also differ in "
            + "; ".join(f"{k} ({', '.join(f'{g.label}: {g.value(k)}' for g in groups)})" for k in groups[0].also)
        )
    lines += [f"the runs of {g.label} differ among themselves in {', '.join(g.mixed)}" for g in groups if g.mixed]
    versions = {run.source.get("version", "unrecorded") for g in groups for run in g.runs}
    if len(versions) > 1:  # numbers may change between versions (CHANGELOG.md)
        lines.append(f"the runs come from p2pfl versions {', '.join(sorted(versions))}")
    return lines


def setting_defaults(algo: str | None) -> dict:
    """Every setting's default for a run of algo, as config.toml writes it (none for an unknown algo)."""
    from p2pfl.algorithms import REGISTRY

    cls = REGISTRY.get(algo)
    return _defaults_of(cls) if cls is not None else {}


@functools.lru_cache(maxsize=None)  # asked for each run and setting; a class's defaults are fixed
def _defaults_of(cls) -> dict:
    from p2pfl.runner.configure import algorithm_defaults
    from p2pfl.settings.fields import declared, default_of, defaults_of
    from p2pfl.settings.run_config import RunConfig

    return {
        **{f.name: default_of(f) for f in declared(RunConfig)},
        **algorithm_defaults(cls),
        **defaults_of(cls.Settings, cls.setting_defaults),
    }


def label_keys(runs: list[Run], keys: list[str]) -> list[str]:
    """The settings that tell groups apart, less those that follow from the algorithm (its own settings,
    its training defaults): with algo among them, a setting that takes one value per algorithm is left
    out of the label."""
    varying = [k for k in keys if len({_same(r.config.get(k)) for r in runs}) > 1]
    if "algo" not in varying:
        return varying
    by_algo: dict[str, list[Run]] = {}
    for run in runs:
        by_algo.setdefault(run.config.get("algo"), []).append(run)
    follows = {
        k
        for k in varying
        if k != "algo" and all(len({_same(r.config.get(k)) for r in part}) == 1 for part in by_algo.values())
    }
    return [k for k in varying if k not in follows]


def _same(value) -> str:
    """A setting's value as compared: 5 and 5.0 are one value (a TOML file may write either)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return repr(float(value))
    return repr(value)


def _short(value) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def headline(runs: list[Run]) -> str:
    """test_acc where the runs have it (classification), else test_loss."""
    return "acc" if all(any("test_acc" in r for r in run.rows) for run in runs) else "loss"


def first_reaching(run: Run, key: str, target: float, higher: bool) -> int | None:
    for k, v in sorted(run.curve(key).items()):
        if not math.isnan(v) and (v >= target if higher else v <= target):
            return k
    return None


def table(groups: list[Group], metric: str, targets: list[float]) -> list[dict]:
    """One row per group: runs, final value (mean, std, min, max), mean client's final value, bytes and
    wall time in all, and for each target the mean rounds and bytes of the runs that reached it."""
    higher = metric == "acc"
    key = f"test_{metric}"
    out = []
    for group in groups:
        finals = np.array([run.final(key) for run in group.runs])
        client_key = f"client_{metric}_mean"
        clients = [run.final(client_key) for run in group.runs if run.curve(client_key)]
        row = {
            "group": group.label,
            "runs": len(group.runs),
            f"final_{metric}_mean": finals.mean(),
            f"final_{metric}_std": finals.std(),
            f"final_{metric}_min": finals.min(),
            f"final_{metric}_max": finals.max(),
            f"final_client_{metric}_mean": float(np.mean(clients)) if clients else None,
            "rounds": max(run.rows[-1]["round"] for run in group.runs),
            "mib_sent": float(np.mean([run.cumulative("bytes_sent")[run.rows[-1]["round"]] for run in group.runs]))
            / MIB,
            "s_per_round": float(np.mean([np.mean([round_seconds(r) for r in run.rows]) for run in group.runs])),
            "s_counts": "training" if any(run.training_time_only for run in group.runs) else "whole round",
            "sim_s": float(np.mean([run.final("sim_time_s") for run in group.runs])) if group.timed else None,
            "spectral_gap": group.gap(),
            "final_consensus_distance": (
                float(np.mean([run.final("consensus_distance") for run in group.runs]))
                if all(run.curve("consensus_distance") for run in group.runs)
                else None
            ),
            **{f"setting_{k}": group.value(k) for k in group.also},  # what differs beside the label
            "p2pfl": ", ".join(sorted({run.made_by for run in group.runs})),
        }
        for target in targets:
            reached = [(run, first_reaching(run, key, target, higher)) for run in group.runs]
            reached = [(run, k) for run, k in reached if k is not None]
            row[f"reached_{target:g}"] = f"{len(reached)}/{len(group.runs)}"
            row[f"rounds_to_{target:g}"] = float(np.mean([k for _, k in reached])) if reached else None
            row[f"mib_to_{target:g}"] = (
                float(np.mean([run.cumulative("bytes_sent")[k] for run, k in reached])) / MIB if reached else None
            )
            row[f"sim_s_to_{target:g}"] = (  # the virtual seconds it took (p2pfl.comm.clock)
                float(np.mean([run.curve("sim_time_s")[k] for run, k in reached])) if reached and group.timed else None
            )
        out.append(row)
    return out


def _cell(value, percent: bool) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    return f"{100 * value:.2f}" if percent else f"{value:.4g}"


def is_accuracy_column(header: str) -> bool:
    """final_acc_*, final_client_acc_mean: accuracies (in % in the table); final_consensus_distance is not."""
    return header.startswith("final_") and "acc" in header


def markdown(rows: list[dict], metric: str, notes: list[str] = ()) -> str:
    percent = metric == "acc"
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row[h], percent and is_accuracy_column(h)) for h in header) + " |")
    unit = "final_* accuracies in %; " if percent else ""
    return (
        "\n".join(lines)
        + (
            f"\n\n{unit}rounds_to_X and mib_to_X average the runs that reached X "
            "(reached_X says how many); mib = MiB sent by all peers; s_per_round = a round's wall time, "
            "evaluation included (s_counts says training where runs predate round_s); sim_s and sim_s_to_X: "
            "the virtual clock's seconds (sim_time_s), in all and to X.\n"
        )
        + "".join(f"\nNot like with like: {note}.\n" for note in notes)
    )


PANEL_IN = (4.6, 4.2)  # inches a panel takes (width, height)
LEGEND_COLUMNS = 2
LABEL_CHARACTERS = 70  # a legend entry wider than this wraps


def draw(
    groups: list[Group], metric: str, band: str, path: Path, title: str, targets: list[float] = (), y: str | None = None
) -> None:
    """The y quantity (the test metric, or a metrics.jsonl field such as consensus_distance) against rounds,
    MiB sent and wall time, and, where the groups ran on graphs of more than one gap, its final value
    against the spectral gap (the view topology papers draw); per group the mean over its runs (aggregated
    solid, mean client dotted: p2pfl.measure.figures's vocabulary) and a band over its runs where it has
    several; a grey line at each target. One legend under the panels, its entries wrapped to fit."""
    key = y or f"test_{metric}"
    scale = 100 if key == "test_acc" else 1
    gapped = [g for g in groups if g.gap() is not None and g.rounds(key)]
    if len({round(g.gap(), 9) for g in gapped}) < 2:  # one gap (codecs on one graph): no axis to spread them on
        gapped = []
    timed = all(g.timed for g in groups)  # a panel against the virtual clock's seconds
    panels = 3 + timed + bool(gapped)
    fig, axes = plt.subplots(1, panels, figsize=(PANEL_IN[0] * panels, PANEL_IN[1]))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    handles, values = [], []
    for i, group in enumerate(groups):
        color = colors[i % len(colors)]
        rounds = group.rounds(key)
        if not rounds:
            continue
        stacked = scale * group.stack(key, rounds)
        mean = stacked.mean(0)
        low, high = (
            (mean - stacked.std(0), mean + stacked.std(0)) if band == "std" else (stacked.min(0), stacked.max(0))
        )
        values += list(stacked.ravel())
        xs = [
            np.array(rounds, dtype=float),
            group.stack("bytes_sent", rounds, True).mean(0) / MIB,
            group.stack("round_s", rounds, True).mean(0),
            *([group.stack("sim_time_s", rounds).mean(0)] if timed else []),
        ]
        client = f"client_{metric}_mean" if y is None else None
        for ax, x in zip(axes, xs):
            (line,) = ax.plot(x, mean, AGGREGATED, color=color)
            if len(group.runs) > 1:
                ax.fill_between(x, low, high, color=color, alpha=0.18)
            if client and group.rounds(client) == rounds:
                ax.plot(x, scale * group.stack(client, rounds).mean(0), MEAN_CLIENT, color=color, lw=1.2)
        handles.append((line, group.legend()))
        if group in gapped:  # the final value: the curves' last point and the band's bar there
            centre, bar = mean[-1], [[mean[-1] - low[-1]], [high[-1] - mean[-1]]]
            axes[-1].errorbar([group.gap()], [centre], yerr=bar, fmt="o", color=color, capsize=3)
    older = any(run.training_time_only for group in groups for run in group.runs)
    clock = "wall time (s, cumulative" + ("; training only for runs without round_s)" if older else ")")
    xlabels = ["round", "MiB sent (all peers, cumulative)", clock]
    xlabels += ["virtual time (s, sim_time_s)"] * timed + ["spectral gap (log scale)"] * bool(gapped)
    for ax, xlabel in zip(axes, xlabels):
        for target in targets if y is None else ():
            target_line(ax, scale * target, f"target {scale * target:g}" + ("%" if metric == "acc" else ""))
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5))
        if metric != "acc" or (values and min(values) > 0 and max(values) / min(values) > 1e3):
            ax.set_yscale("log")
    whole_numbers(axes[0].xaxis)
    if gapped:
        axes[-1].set_xscale("log")
        axes[-1].set_title(
            f"final value against the graph's gap (bar: {'min-max' if band == 'minmax' else '+-1 std'})", fontsize=9
        )
    sent = [group.stack("bytes_sent", group.rounds(key), True).mean(0)[-1] for group in groups if group.rounds(key)]
    if sent and min(sent) > 0 and max(sent) / min(sent) > BYTES_SPREAD:  # codecs, or rounds of unequal cost
        axes[1].set_xscale("log")
        axes[1].set_xlabel("MiB sent (all peers, cumulative; log scale)")
    names = {"test_acc": "test accuracy (%)", "test_loss": "test loss"}
    for ax in axes:
        ax.set_ylabel(names.get(key, key.replace("_", " ")))
    if y is None:
        handles += [(plt.Line2D([], [], color="k", ls=AGGREGATED), "aggregated model")]
        handles += [(plt.Line2D([], [], color="k", ls=MEAN_CLIENT, lw=1.2), "mean client")]
    heading = f"{title}\n{subtitle(groups, metric, band, key)}" if title else subtitle(groups, metric, band, key)
    caption = "\n".join(f"Not like with like: {note}." for note in caveats(groups))
    lay_out(fig, handles, heading, caption, path)


def lay_out(fig, handles: list, heading: str, caption: str, path: Path) -> None:
    """The panels on top, one legend under them (entries wrapped), the caption under it: each in room of
    its own, measured in lines, so that no label leaves the figure or covers a panel."""
    labels = [textwrap.fill(label, LABEL_CHARACTERS) for _, label in handles]
    rows = sum(
        max(label.count("\n") + 1 for label in labels[i : i + LEGEND_COLUMNS])
        for i in range(0, len(labels), LEGEND_COLUMNS)
    )
    caption = textwrap.fill(caption, 180) if caption else ""
    line_in = 0.19  # inches a line of 8-point text takes
    legend_in = rows * line_in + 0.3
    caption_in = (caption.count("\n") + 1) * 0.15 + 0.1 if caption else 0.0
    heading_in = (heading.count("\n") + 1) * 0.22 + 0.1
    width, panels_in = fig.get_size_inches()
    height = panels_in + legend_in + caption_in + heading_in
    fig.set_size_inches(width, height)
    fig.suptitle(heading, fontsize=11, y=1 - 0.05 / height)
    fig.legend(
        [h for h, _ in handles],
        labels,
        loc="upper center",
        bbox_to_anchor=(0.5, (legend_in + caption_in) / height),
        ncol=LEGEND_COLUMNS,
        fontsize=8,
        frameon=False,
    )
    if caption:
        fig.text(0.01, 0.05 / height, caption, fontsize=7, color="dimgrey", va="bottom")
    fig.tight_layout(rect=(0, (legend_in + caption_in) / height, 1, 1 - heading_in / height))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def subtitle(groups: list[Group], metric: str, band: str, key: str | None = None) -> str:
    """What the figure compares: the metric, the settings that tell the groups apart, what all runs share,
    and what the band is (none where every group is one run)."""
    runs = [run for group in groups for run in group.runs]
    told_apart = groups[0].settings
    shared = {
        k: runs[0].config.get(k)
        for k in ("algo", "dataset", "peers", "model")
        if k not in told_apart and len({_same(r.config.get(k)) for r in runs}) == 1 and k in runs[0].config
    }
    what = (
        f"test {'accuracy' if metric == 'acc' else metric}"
        if key in (None, f"test_{metric}")
        else key.replace("_", " ")
    )
    what += f" of {len(groups)} groups by {', '.join(told_apart)}" if told_apart else f" of {len(groups)} group(s)"
    if shared:
        what += " (" + ", ".join(f"{k} {_short(v)}" for k, v in shared.items()) + ")"
    sizes = sorted({len(group.runs) for group in groups})
    if sizes == [1]:
        return what + "; one run per group, no band"
    spread = "min-max" if band == "minmax" else "+-1 std"
    seeds = f"{sizes[0]}" if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"
    return what + f"; band: {spread} over {seeds} runs (seeds)"


def compare(
    folders: list[Path],
    by: list[str] | None = None,
    targets: list[float] | None = None,
    band: str = "minmax",
    out: Path = Path("comparison.png"),
    title: str = "",
    labels: str | None = None,
    y: str | None = None,
) -> list[dict]:
    """Compare run folders: group them (by the settings in `by`, else by every setting in which they
    differ, seeds apart), draw each group's test accuracy (or loss) against rounds, bytes and time into
    out (PNG, band "minmax" or "std" over a group's seeds), and write out.md and out.csv: per group the
    final and best values, and the rounds and bytes to reach each of `targets` (default 0.8 for
    accuracy). Every setting the groups differ in is named beside them. labels: "folder", or the groups'
    names in order (default: the settings that tell them apart); y: a metrics.jsonl field drawn instead of
    the test metric (consensus_distance). Returns the table's rows."""
    runs = [load_run(f) for f in folders]
    metric = headline(runs)
    kinds = {headline([run]): run for run in runs}
    if len(kinds) > 1:
        raise UserError(
            f"{kinds['acc'].folder} is a classification run (test_acc) and {kinds['loss'].folder} is not "
            "(test_loss only): their curves do not share an axis; compare runs of one task"
        )
    lacking = [str(run.folder) for run in runs if not run.curve(f"test_{metric}")]
    if lacking:
        raise UserError(f"{lacking[0]} has no test_{metric} in any round; compare runs of one task")
    groups = group_runs(runs, by)
    relabel(groups, labels)
    if y is not None and not any(run.curve(y) for run in runs):
        raise UserError(f"--y {y}: no run has it in metrics.jsonl (docs/cli.md lists the metrics)")
    if targets is None:
        targets = [0.8] if metric == "acc" else []
    rows = table(groups, metric, targets)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    draw(groups, metric, band, out, title, targets, y)
    notes = caveats(groups)
    for note in notes:
        print(f"analysis compare: not like with like: {note}", file=sys.stderr)
    out.with_suffix(".md").write_text(markdown(rows, metric, notes))
    with out.with_suffix(".csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return rows


def beside_runs(folders: list[Path]) -> Path:
    """compare.png in the deepest folder that holds every run (a sweep's folder for its runs)."""
    return Path(os.path.commonpath([str(f.resolve().parent) for f in folders])) / "compare.png"


def run_folders(paths: list[Path]) -> list[Path]:
    """The given folders; a folder that is not a run folder stands for the run folders below it."""
    out = []
    for path in paths:
        if (path / "metrics.jsonl").exists() or not path.is_dir():
            out.append(path)
        else:
            found = sorted(p.parent for p in path.rglob("metrics.jsonl"))
            if not found:
                raise UserError(f"no run folder in {path}")
            out.extend(found)
    return out


def main(argv: list[str] | None = None) -> int:
    return guarded("analysis compare", lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    p = Parser(prog="python -m analysis compare", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="run folders, or folders holding run folders")
    p.add_argument(
        "--by", help="comma-separated settings that name a group (e.g. algo); default: every setting but the seed"
    )
    p.add_argument("--target", help="comma-separated target accuracies (fractions) for the table; default 0.8")
    p.add_argument("--band", choices=("minmax", "std"), default="minmax", help="band over seeds")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="figure path; the table goes beside it as .md and .csv (default: compare.png in the "
        "folder that holds all the runs, as a sweep writes it)",
    )
    p.add_argument("--title", default="")
    p.add_argument(
        "--labels", help="the groups' names: 'folder' (their runs' folder), or comma-separated in the table's order"
    )
    p.add_argument("--y", help="a metrics.jsonl field to draw instead of the test metric (e.g. consensus_distance)")
    args = p.parse_args(argv)
    try:
        targets = [float(t) for t in args.target.split(",")] if args.target else None
        if targets and not all(math.isfinite(t) for t in targets):
            raise ValueError
    except ValueError:
        p.error(f"--target takes finite numbers, got {args.target!r}")
    folders = run_folders(args.runs)
    out = output_file(args.out if args.out is not None else beside_runs(folders))
    by = args.by.split(",") if args.by else None
    rows = compare(folders, by, targets, args.band, out, args.title, args.labels, args.y)
    print(out.with_suffix(".md").read_text(), end="")
    print(f"figure: {out}; table: {out.with_suffix('.md')}, {out.with_suffix('.csv')} ({len(rows)} groups)")
    return 0
