"""The figures a run draws into its folder: its metric per round, its partition, NTK-DFL's final averaging,
FedAvg-FT's representation figures. analysis/ reads run folders and reuses these."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import numpy as np

from topologies.drawing import draw_graph, whole_numbers

# One line vocabulary for every figure the project draws: a style means the same thing everywhere.
AGGREGATED = "-"  # the aggregated model (a star's server model, a graph's average of all peers)
MEAN_CLIENT = ":"  # the mean of the peers' own models; a shaded band around it: their min-max
OWN_MIX = "--"  # the mean client on test samples of its own label mix (personalized accuracy)
REFERENCE = "-."  # grey, labelled where it stands: a target (horizontal) or a stage's start (vertical)


def _pyplot():
    """matplotlib's pyplot on the file-only backend, imported at the first figure: a run that draws none
    (a benchmark's, a device check's step) does not load matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def __getattr__(name: str):
    if name == "plt":  # analysis/ draws with the same pyplot
        return _pyplot()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def target_line(ax, y: float, text: str) -> None:
    """A horizontal reference at y, its text at the right end."""
    ax.axhline(y, color="grey", lw=0.8, ls=REFERENCE)
    ax.annotate(
        text,
        (1, y),
        xycoords=("axes fraction", "data"),
        xytext=(-2, 2),
        textcoords="offset points",
        ha="right",
        fontsize=7,
        color="grey",
    )


def finish(
    fig, ax, path: Path, xlabel: str, ylabel: str, title: str, per_round: bool = True, caption: str = ""
) -> None:
    """Labels, grid and legend, then save and close. per_round: integer x ticks and the legend at the
    lower right; else (log axes) minor grid lines too and the legend where it fits."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if per_round:
        whole_numbers(ax.xaxis)
    ax.grid(alpha=0.3, which="major" if per_round else "both")
    ax.legend(loc="lower right" if per_round else "best")
    save(fig, path, caption)


def save(fig, path: Path, caption: str = "") -> None:
    """Lay out, save and close; a caption goes in small grey type under the axes."""
    if caption:
        fig.text(0.01, 0.005, caption, fontsize=7, color="dimgrey", wrap=True, va="bottom")
    fig.tight_layout(rect=(0, 0.07, 1, 1) if caption else None)
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)


PLOT_FILES = {"acc": "accuracy.png", "loss": "loss.png"}


def plot_metric(rows: list[dict], task, run_dir: Path, title: str = "") -> Path:
    """The task's headline metric per round in the line vocabulary above; accuracy.png for
    classification, loss.png (log scale) for regression."""
    key = task.headline
    every, rows = rows, [r for r in rows if f"test_{key}" in r]
    scale = 100 if key == "acc" else 1
    fig, ax = _pyplot().subplots(figsize=(7, 4.5))
    if rows:
        x = [r["round"] for r in rows]
        ax.plot(x, [scale * r[f"test_{key}"] for r in rows], AGGREGATED, color="tab:blue", label="aggregated model")
        ax.plot(
            x, [scale * r[f"client_{key}_mean"] for r in rows], MEAN_CLIENT, color="tab:orange", label="mean client"
        )
        if all(f"client_{key}_min" in r for r in rows):  # every client scored on every test sample
            low = [r[f"client_{key}_min"] for r in rows]
            high, band = [r[f"client_{key}_max"] for r in rows], "client min-max"
        else:  # on subsets: the mean's precision (the clients' extremes would be biased there)
            se = [2 * r.get(f"client_{key}_se", 0.0) for r in rows]
            low = [r[f"client_{key}_mean"] - e for r, e in zip(rows, se)]
            high, band = [r[f"client_{key}_mean"] + e for r, e in zip(rows, se)], "mean client +- 2 s.e."
        ax.fill_between(
            x, [scale * v for v in low], [scale * v for v in high], color="tab:orange", alpha=0.15, label=band
        )
        personal = [r for r in rows if "client_personal_acc_mean" in r] if key == "acc" else []
        if personal:
            ax.plot(
                [r["round"] for r in personal],
                [scale * r["client_personal_acc_mean"] for r in personal],
                OWN_MIX,
                color="tab:green",
                label="mean client, own label mix",
            )
    if not task.higher_is_better:
        ax.set_yscale("log")
    for switch in ("stage", "phase"):
        mark_switches(ax, every, switch)
    path = run_dir / PLOT_FILES.get(key, f"{key}.png")
    finish(fig, ax, path, "round", "test accuracy (%)" if key == "acc" else f"test {key}", title)
    return path


def mark_switches(ax, rows: list[dict], key: str = "stage") -> None:
    """A reference line, labelled, where a run moves to its next stage or phase (TCT's convexified stage 2,
    CyclicFL's FL phase)."""
    for before, after in zip(rows, rows[1:]):
        if before.get(key) != after.get(key):
            x = (before["round"] + after["round"]) / 2
            ax.axvline(x, color="grey", ls=REFERENCE, lw=1)
            ax.annotate(f" {key} {after[key]}", (x, 0.02), xycoords=("data", "axes fraction"), color="grey")


def plot_run_header(parts: list[dict], class_names, graph, title: str, folder: Path) -> None:
    """A run folder's partition.png (where the data has classes: parts, data.summary's) and
    topology.png (the first round's graph, titled)."""
    if "classes" in parts[0]:
        with naming(folder / "partition.png"):
            plot_partition(parts, folder / "partition.png", class_names)
    with naming(folder / "topology.png"):
        draw_graph(graph, folder / "topology.png", title)


@contextmanager
def naming(path: Path):
    """An OSError while writing path names it (a plotting library's may not)."""
    try:
        yield
    except OSError as exc:
        if exc.filename:
            raise
        raise OSError(exc.errno or 5, exc.strerror or str(exc), str(path)) from exc


def plot_partition(summary: list[dict], path: Path, class_names: tuple[str, ...] | None = None) -> None:
    """Samples of each class held by each peer (rows: peers); columns named where the dataset names its
    classes."""
    counts = np.array([s["classes"] for s in summary])
    named = class_names is not None and len(class_names) == counts.shape[1]
    fig, ax = _pyplot().subplots(figsize=(6.5, min(10, (3.2 if named else 2.4) + 0.03 * len(counts))))
    im = ax.imshow(
        counts,
        aspect="auto",
        interpolation="nearest",
        cmap="viridis",
        extent=(-0.5, counts.shape[1] - 0.5, len(counts) - 0.5, -0.5),
    )
    if named:
        ax.set_xticks(range(len(class_names)), class_names, rotation=40, ha="right", fontsize=8)
    else:
        whole_numbers(ax.xaxis)
    whole_numbers(ax.yaxis)
    ax.set_xlabel("class")
    ax.set_ylabel("peer")
    ax.set_title(f"partition: {len(counts):,} peers, {int(counts.sum()):,} samples")
    bar = fig.colorbar(im, ax=ax, label="samples")
    whole_numbers(bar.ax.yaxis)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    _pyplot().close(fig)


def plot_final_averaging(result: dict, path: Path, caption: str = "") -> None:
    """NTK-DFL fig. 5, two panels on one accuracy axis: the test accuracy of the average of the first n
    peers for each averaging order; beside it, how many peers' own models score each accuracy."""
    fig, (ax, hist) = _pyplot().subplots(1, 2, figsize=(9, 4.5), sharey=True, gridspec_kw={"width_ratios": [3, 1]})
    styles = {"high-to-low": "tab:red", "random": "tab:green", "low-to-high": "tab:blue"}
    for name, curve in result["orders"].items():
        ax.plot(result["n"], [100 * a for a in curve["test_acc"]], AGGREGATED, color=styles.get(name), label=name)
    sel = result["selected"]
    ax.plot(
        [sel["peers"]],
        [100 * sel["test_acc"]],
        "k*",
        ms=10,
        label=f"selected on the validation half (n={sel['peers']})",
    )
    own = [100 * a for a in result["client_val_acc"]]
    hist.hist(own, bins=min(30, max(5, len(own) // 3)), orientation="horizontal", color="grey", alpha=0.6)
    whole_numbers(hist.xaxis)
    hist.set(xlabel="peers", title="peers' own models\n(validation half)")
    hist.grid(alpha=0.3)
    finish(
        fig,
        ax,
        path,
        "peers averaged (n)",
        "test accuracy (%)",
        "final model averaging: the first n peers",
        caption=caption,
    )


# FedAvg with fine-tuning (Collins et al. 2022): the principal-angle distance and the global gradient norm
# per round (figs. 1 and 3 left), new clients' fine-tuning error or accuracy against their number of
# samples (fig. 3 right, fig. 5), and the class-pair cosine similarity of learned features (fig. 4).


def plot_per_round(runs: dict[str, list[dict]], key: str, path: Path, ylabel: str, title: str) -> None:
    """One curve per labelled run of rows {round, key}, log scale."""
    fig, ax = _pyplot().subplots(figsize=(6.5, 4.2))
    for label, rows in runs.items():
        ax.plot([r["round"] for r in rows], [r[key] for r in rows], label=label)
    ax.set_yscale("log")
    whole_numbers(ax.xaxis)
    finish(fig, ax, path, "round", ylabel, title, per_round=False)


def plot_fine_tuning(runs: dict[str, dict], path: Path, metric: str) -> None:
    """Mean and std band against n, one curve per labelled run ({n: {mean, std}}; a None mean, all
    diverged, leaves a gap)."""
    fig, ax = _pyplot().subplots(figsize=(6.5, 4.2))
    for label, table in runs.items():
        n = np.array([int(k) for k in table])
        mean = np.array([np.nan if v["mean"] is None else v["mean"] for v in table.values()], dtype=float)
        std = np.array([np.nan if v["std"] is None else v["std"] for v in table.values()], dtype=float)
        scale = 100 if metric == "accuracy" else 1
        ax.plot(n, scale * mean, "o-", label=label)
        ax.fill_between(n, scale * (mean - std), scale * (mean + std), alpha=0.2)
    ax.set_xscale("log")
    if metric != "accuracy":
        ax.set_yscale("log")
    ylabel = "new clients' test accuracy (%)" if metric == "accuracy" else "fine-tuning error ||Bw - B*w*||^2"
    finish(
        fig, ax, path, "samples n of the new client", ylabel, f"after fine-tuning: {metric} against n", per_round=False
    )


def plot_linear_run(runs: dict[str, tuple[list[dict], dict]], out: Path) -> None:
    """rep_dist.png (fig. 1), grad_norm.png (fig. 3 left), finetune_error.png (fig. 3 right)."""
    histories = {label: history for label, (history, _) in runs.items()}
    plot_per_round(histories, "rep_dist", out / "rep_dist.png", "dist(B_t, B*)", "principal-angle distance to B*")
    plot_per_round(
        histories,
        "grad_norm",
        out / "grad_norm.png",
        "||grad of the global loss||",
        "gradient norm of the global objective",
    )
    plot_fine_tuning({label: result for label, (_, result) in runs.items()}, out / "finetune_error.png", "error")


def plot_similarity(matrix: np.ndarray, path: Path, title: str) -> None:
    fig, ax = _pyplot().subplots(figsize=(5, 4.4))
    im = ax.imshow(matrix, vmin=-1, vmax=1, cmap="RdBu_r")
    ax.set_xticks(range(len(matrix)))
    ax.set_yticks(range(len(matrix)))
    ax.set_xlabel("class")
    ax.set_ylabel("class")
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
