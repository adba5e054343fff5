"""Figures of FedAvg with fine-tuning (Collins et al. 2022): the principal-angle distance and the
global gradient norm per round (the paper's figs. 1 and 3 left), the fine-tuning error or accuracy of
new clients against their number of samples (fig. 3 right, fig. 5), and the class-pair cosine
similarity of learned features (fig. 4). Each takes one or several labelled runs."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from analysis.plots import finish  # noqa: E402


def plot_per_round(runs: dict[str, list[dict]], key: str, path: Path, ylabel: str, title: str) -> None:
    """One curve per labelled run of rows {round, key}, log scale."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for label, rows in runs.items():
        ax.plot([r["round"] for r in rows], [r[key] for r in rows], label=label)
    ax.set_yscale("log")
    finish(fig, ax, path, "round", ylabel, title, per_round=False)


def plot_fine_tuning(runs: dict[str, dict], path: Path, metric: str) -> None:
    """Mean and std band against n, one curve per labelled run ({n: {mean, std}}; a None mean, all
    diverged, leaves a gap)."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
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
    finish(fig, ax, path, "samples n of the new client", ylabel, f"after fine-tuning: {metric} against n",
           per_round=False)


def plot_linear_run(runs: dict[str, tuple[list[dict], dict]], out: Path) -> None:
    """rep_dist.png (fig. 1), grad_norm.png (fig. 3 left), finetune_error.png (fig. 3 right)."""
    histories = {label: history for label, (history, _) in runs.items()}
    plot_per_round(histories, "rep_dist", out / "rep_dist.png", "dist(B_t, B*)", "principal-angle distance to B*")
    plot_per_round(histories, "grad_norm", out / "grad_norm.png", "||grad of the global loss||",
                   "gradient norm of the global objective")
    plot_fine_tuning({label: result for label, (_, result) in runs.items()}, out / "finetune_error.png", "error")


def plot_similarity(matrix: np.ndarray, path: Path, title: str) -> None:
    fig, ax = plt.subplots(figsize=(5, 4.4))
    im = ax.imshow(matrix, vmin=-1, vmax=1, cmap="RdBu_r")
    ax.set_xticks(range(len(matrix)))
    ax.set_yticks(range(len(matrix)))
    ax.set_xlabel("class")
    ax.set_ylabel("class")
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
