"""The NTK-DFL paper's figures, drawn from run folders.

    python -m analysis figures RUNS_DIR [--out DIR]

RUNS_DIR holds the runs that `launch.figures` makes (`make figures`, `make figures-quick`), one folder
per name of `figure_runs()`; a figure whose runs are missing is skipped with a note. Each PNG carries a
caption naming the runs it came from, and OUT/captions.md lists them all (default OUT: RUNS_DIR/figures).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from analysis.compare import MIB, Run, load_run
from analysis.plots import AGGREGATED, MEAN_CLIENT, plot_final_averaging, plt, save, whole_numbers
from analysis.toolkit import Parser, guarded
from p2pfl.errors import UserError

BASELINES = ("dfedavg", "dfedavgm", "dpsgd", "dispfl")
SPREAD = ("ntk-dfl", "dfedavg")  # the runs whose clients' spread figs. 3 and 6 draw
SPLITS = {
    "alpha0.1": {"partition": "dirichlet", "alpha": 0.1},
    "alpha0.5": {"partition": "dirichlet", "alpha": 0.5},
    "iid": {"partition": "iid"},
}
KAPPAS = (2, 3, 8)  # with the base kappa 5
TOPOLOGIES = {"erdos-renyi": {"topology": "erdos-renyi"}, "ring": {"topology": "ring"}}
BATCHES = (2, 4)  # Jacobian batching m1
SUBSAMPLES = (2, 4)  # data subsampling m2
# Compression runs (figs. 15-16) form a family of their own, at the experiment's [compression] scale: top-k
# and quantisation act on dense Jacobians (3.2 MB a sample for the 784-input MLP), which a CPU holds for
# few samples; the random projection shrinks them. "dense" is the lossless factored message, whose
# bytes_dense is what the uncompressed Jacobians would weigh.
COMPRESSION = {
    "dense": {"algo": "ntk-dfl"},
    "dfedavg": {"algo": "dfedavg"},
    "proj100": {"algo": "ntk-dfl", "ntk-projection": 100},
    "proj100+quant8": {"algo": "ntk-dfl", "ntk-projection": 100, "ntk-quant-bits": 8},
    "proj100+topk0.1": {"algo": "ntk-dfl", "ntk-projection": 100, "ntk-topk": 0.1},
    "proj100+topk0.1+sub2": {"algo": "ntk-dfl", "ntk-projection": 100, "ntk-topk": 0.1, "ntk-subsample": 2},
}
FAMILY = "compression/"
COLORS = {
    "ntk-dfl": "tab:red",
    "dfedavg": "tab:blue",
    "dfedavgm": "tab:green",
    "dpsgd": "tab:purple",
    "dispfl": "tab:orange",
}


def figure_runs() -> dict[str, dict]:
    """Every run the figures need: its name (folder under RUNS_DIR) and its settings on top of the scale's
    (the base: Fashion-MNIST, Dirichlet alpha 0.1, a 5-regular graph drawn anew each round)."""
    runs: dict[str, dict] = {}
    every_client = {"client-test-samples": 0}  # the min-max bands of figs. 3 and 6: every client on every image
    for split, settings in SPLITS.items():
        for algo in ("ntk-dfl", *BASELINES):
            runs[f"{split}/{algo}"] = {"algo": algo, **settings, **(every_client if algo in SPREAD else {})}
    for algo in ("ntk-dfl", "dfedavg"):
        for kappa in KAPPAS:
            runs[f"kappa{kappa}/{algo}"] = {"algo": algo, "kappa": kappa}
        for name, settings in TOPOLOGIES.items():
            runs[f"{name}/{algo}"] = {"algo": algo, **settings}
    runs["no-avg/ntk-dfl"] = {"algo": "ntk-dfl", "ntk-no-avg": True, **every_client}
    for m in BATCHES:
        runs[f"batches{m}/ntk-dfl"] = {"algo": "ntk-dfl", "ntk-batches": m}
    for m in SUBSAMPLES:
        runs[f"subsample{m}/ntk-dfl"] = {"algo": "ntk-dfl", "ntk-subsample": m}
    for name, settings in COMPRESSION.items():
        runs[FAMILY + name] = settings
    return runs


class Figures:
    """Draws each figure from the runs found under a folder, with its caption."""

    def __init__(self, runs_dir: Path, out: Path):
        self.runs_dir, self.out = Path(runs_dir), Path(out)
        self.captions: dict[str, str] = {}
        self.skipped: dict[str, list[str]] = {}
        self._cache: dict[str, Run | None] = {}

    def run(self, name: str) -> Run | None:
        """The named run if it finished (its metrics reach its last round), else None."""
        if name not in self._cache:
            folder = self.runs_dir / name
            ok = (folder / "metrics.jsonl").exists() and (folder / "config.toml").exists()
            run = load_run(folder) if ok and (folder / "metrics.jsonl").stat().st_size else None
            self._cache[name] = run if run and run.rows[-1]["round"] == run.config["rounds"] else None
        return self._cache[name]

    def need(self, figure: str, names: list[str]) -> dict[str, Run] | None:
        """The runs, or None (the figure is skipped) when any is missing."""
        names = list(dict.fromkeys(names))
        missing = [n for n in names if self.run(n) is None]
        if missing:
            self.skipped[figure] = missing
            return None
        return {n: self.run(n) for n in names}

    def scale(self, run: Run) -> str:
        c = run.config
        return (
            f"{c['peers']} peers x {c.get('samples_per_peer')} samples, {c['dataset']}, {c['rounds']} rounds, "
            f"seed {c['seed']}"
        )

    def save(self, fig, name: str, caption: str) -> None:
        for ax in fig.axes:  # rounds and kappa count: whole-number ticks
            if ax.get_xlabel() == "round" or ax.get_xlabel().startswith("neighbours kappa"):
                whole_numbers(ax.xaxis)
        save(fig, self.out / f"{name}.png", caption)
        self.captions[name] = caption

    # fig. 2: accuracy against rounds for every method on each split
    def convergence(self) -> None:
        names = [f"{s}/{a}" for s in SPLITS for a in ("ntk-dfl", *BASELINES)]
        runs = self.need("fig2_convergence", names)
        if runs is None:
            return
        fig, axes = plt.subplots(1, 3, figsize=(16, 4.8), sharey=True)
        for ax, split in zip(axes, SPLITS):
            for algo in ("ntk-dfl", *BASELINES):
                curve = runs[f"{split}/{algo}"].curve("test_acc")
                ax.plot(
                    list(curve),
                    [100 * v for v in curve.values()],
                    color=COLORS[algo],
                    label=algo,
                    lw=2 if algo == "ntk-dfl" else 1.2,
                )
            ax.set_title(split.replace("alpha", "alpha = "))
            ax.set_xlabel("round")
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("aggregated model test accuracy (%)")
        axes[0].legend(loc="lower right")
        self.save(
            fig,
            "fig2_convergence",
            "Fig. 2: aggregated-model test accuracy per round. Runs: "
            f"{{alpha0.1,alpha0.5,iid}}/{{ntk-dfl,{','.join(BASELINES)}}} ({self.scale(runs[names[0]])}).",
        )

    # fig. 3 (paper fig. 4): aggregated model against mean, min and max client
    def aggregation_gain(self) -> None:
        names = [f"{s}/{a}" for s in SPLITS for a in ("ntk-dfl", "dfedavg")]
        runs = self.need("fig3_aggregated_vs_clients", names)
        if runs is None:
            return
        fig, axes = plt.subplots(1, 3, figsize=(16, 4.8), sharey=True)
        for ax, split in zip(axes, SPLITS):
            for algo in ("ntk-dfl", "dfedavg"):
                run = runs[f"{split}/{algo}"]
                rounds = sorted(run.curve("test_acc"))
                get = lambda key: [100 * run.curve(key)[k] for k in rounds]  # noqa: E731
                ax.plot(rounds, get("test_acc"), AGGREGATED, color=COLORS[algo], label=f"{algo} aggregated")
                ax.plot(rounds, get("client_acc_mean"), MEAN_CLIENT, color=COLORS[algo], label=f"{algo} mean client")
                if run.curve("client_acc_min"):  # runs that scored every client on every test sample
                    ax.fill_between(rounds, get("client_acc_min"), get("client_acc_max"), color=COLORS[algo], alpha=0.1)
            ax.set_title(split.replace("alpha", "alpha = "))
            ax.set_xlabel("round")
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("test accuracy (%)")
        axes[0].legend(loc="lower right", fontsize=8)
        self.save(
            fig,
            "fig3_aggregated_vs_clients",
            "Aggregated model (solid) against the mean client (dotted) "
            "and the clients' min-max (band). Runs: {alpha0.1,alpha0.5,iid}/{ntk-dfl,dfedavg} "
            f"({self.scale(runs[names[0]])}).",
        )

    # fig. 4 (paper figs. 3, 11, 12): topologies, sparsity kappa, heterogeneity
    def topology_and_sparsity(self) -> None:
        algos = ("ntk-dfl", "dfedavg")
        names = [f"{t}/{a}" for t in ("alpha0.1", *TOPOLOGIES) for a in algos]
        names += [f"kappa{k}/{a}" for k in KAPPAS for a in algos]
        names += [f"{s}/{a}" for s in SPLITS for a in ("ntk-dfl", *BASELINES)]
        runs = self.need("fig4_topology_sparsity", names)
        if runs is None:
            return
        fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
        markers = {"alpha0.1": "o", "erdos-renyi": "s", "ring": "^"}  # all aggregated: solid, told apart by marker
        for topo, marker in markers.items():
            for algo in algos:
                curve = runs[f"{topo}/{algo}"].curve("test_acc")
                label = "regular kappa=5" if topo == "alpha0.1" else topo
                axes[0].plot(
                    list(curve),
                    [100 * v for v in curve.values()],
                    AGGREGATED,
                    marker=marker,
                    ms=4,
                    markevery=max(1, len(curve) // 8),
                    color=COLORS[algo],
                    label=f"{algo}, {label}",
                )
        axes[0].set(xlabel="round", ylabel="aggregated test accuracy (%)", title="topologies (alpha = 0.1)")
        kappas = sorted((*KAPPAS, 5))
        for algo in algos:
            folder = {k: f"kappa{k}/{algo}" if k != 5 else f"alpha0.1/{algo}" for k in kappas}
            final = [100 * runs[folder[k]].final("test_acc") for k in kappas]
            client = [100 * runs[folder[k]].final("client_acc_mean") for k in kappas]
            axes[1].plot(kappas, final, "o" + AGGREGATED, color=COLORS[algo], label=f"{algo} aggregated")
            axes[1].plot(kappas, client, "o" + MEAN_CLIENT, color=COLORS[algo], label=f"{algo} mean client")
        axes[1].set(
            xlabel="neighbours kappa (regular graph)", ylabel="final test accuracy (%)", title="sparsity (alpha = 0.1)"
        )
        for algo in ("ntk-dfl", *BASELINES):
            axes[2].plot(
                range(3),
                [100 * runs[f"{s}/{algo}"].final("test_acc") for s in SPLITS],
                "o-",
                color=COLORS[algo],
                label=algo,
            )
        axes[2].set_xticks(range(3), ["alpha 0.1", "alpha 0.5", "IID"])
        axes[2].set(ylabel="final aggregated test accuracy (%)", title="heterogeneity")
        for ax in axes:
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, loc="lower right")
        self.save(
            fig,
            "fig4_topology_sparsity",
            "Topologies (left), kappa (middle, final round) and heterogeneity "
            "(right, final round). Runs: {alpha0.1,erdos-renyi,ring,kappa2,kappa3,kappa8}/{ntk-dfl,dfedavg}, "
            f"{{alpha0.1,alpha0.5,iid}}/{{ntk-dfl,{','.join(BASELINES)}}} ({self.scale(runs[names[0]])}).",
        )

    # fig. 5: final averaging with selection
    def final_averaging(self) -> None:
        run = self.need("fig5_final_averaging", ["alpha0.1/ntk-dfl"])
        path = self.runs_dir / "alpha0.1/ntk-dfl/final.json"
        if run is None or not path.exists():
            self.skipped["fig5_final_averaging"] = ["alpha0.1/ntk-dfl (final.json)"]
            return
        result = json.loads(path.read_text())
        sel = result["selected"]
        caption = (
            "Fig. 5: test accuracy (half of the test set) of the average of the first n peers, ordered by their "
            "accuracy on the other half (high-to-low, the paper's selection), at random, or low-to-high; right: "
            f"how many peers' own models reach each validation accuracy. Selected: {sel['peers']} peers, "
            f"{100 * sel['test_acc']:.2f}%. Run: alpha0.1/ntk-dfl ({self.scale(run['alpha0.1/ntk-dfl'])})."
        )
        plot_final_averaging(result, self.out / "fig5_final_averaging.png", caption)
        self.captions["fig5_final_averaging"] = caption

    # fig. 6: with and without per-round averaging
    def averaging_ablation(self) -> None:
        runs = self.need("fig6_per_round_averaging", ["alpha0.1/ntk-dfl", "no-avg/ntk-dfl"])
        if runs is None:
            return
        # one panel a setting: two min-max bands on one axis blend into one colour
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), sharey=True)
        for ax, (name, color, label) in zip(
            axes,
            (
                ("alpha0.1/ntk-dfl", "tab:red", "with per-round averaging"),
                ("no-avg/ntk-dfl", "tab:blue", "without (--ntk-no-avg)"),
            ),
        ):
            run = runs[name]
            rounds = sorted(run.curve("client_acc_mean"))
            get = lambda key: [100 * run.curve(key)[k] for k in rounds]  # noqa: E731
            band = bool(run.curve("client_acc_min"))  # runs that scored every client on every test sample
            if band:
                ax.fill_between(rounds, get("client_acc_min"), get("client_acc_max"), color=color, alpha=0.2)
            ax.plot(
                rounds,
                get("client_acc_mean"),
                MEAN_CLIENT,
                color=color,
                label="mean client, min-max band" if band else "mean client",
            )
            ax.plot(rounds, get("test_acc"), AGGREGATED, color=color, lw=1, label="aggregated model")
            ax.set(xlabel="round", title=label)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8, loc="lower right")
        axes[0].set_ylabel("test accuracy (%)")
        fig.suptitle("per-round averaging ablation (alpha = 0.1)")
        self.save(
            fig,
            "fig6_per_round_averaging",
            "Fig. 6: the spread of the clients' own models with and without "
            f"per-round averaging. Runs: alpha0.1/ntk-dfl, no-avg/ntk-dfl ({self.scale(runs['no-avg/ntk-dfl'])}).",
        )

    # fig. 7: inter-model variance against final accuracy
    def variance(self) -> None:
        found = {n: self.run(n) for n in figure_runs() if not n.startswith(FAMILY)}  # those are at another scale
        runs = {n: r for n, r in found.items() if r is not None and any("variance" in row for row in r.rows)}
        if len(runs) < 2:
            self.skipped["fig7_variance"] = ["at least two runs with a variance"]
            return
        fig, ax = plt.subplots(figsize=(7, 4.8))
        seen = set()
        for name, run in runs.items():
            algo = run.config["algo"]
            ax.scatter(
                run.final("variance"),
                100 * run.final("test_acc"),
                color=COLORS.get(algo, "grey"),
                label=None if algo in seen else algo,
                s=25,
            )
            seen.add(algo)
        ax.set_xscale("log")
        ax.set(
            xlabel="inter-model variance V at the last round (eq. 6)",
            ylabel="final aggregated test accuracy (%)",
            title="variance and accuracy",
        )
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
        self.save(
            fig,
            "fig7_variance",
            f"Fig. 7: one point per run ({len(runs)} runs: every run of this figure set "
            f"but the compression runs, which have a scale of their own; {self.scale(next(iter(runs.values())))}).",
        )

    # figs. 13-14: Jacobian batching and data subsampling
    def batching(self) -> None:
        names = [
            "alpha0.1/ntk-dfl",
            *(f"batches{m}/ntk-dfl" for m in BATCHES),
            *(f"subsample{m}/ntk-dfl" for m in SUBSAMPLES),
        ]
        runs = self.need("fig13_batching_subsampling", names)
        if runs is None:
            return
        fig, axes = plt.subplots(2, 2, figsize=(13, 8.5), sharey=True)
        for col, kind, values, title in (
            (0, "batches", BATCHES, "Jacobian batching m1"),
            (1, "subsample", SUBSAMPLES, "data subsampling m2"),
        ):
            for m in (1, *values):
                run = runs["alpha0.1/ntk-dfl" if m == 1 else f"{kind}{m}/ntk-dfl"]
                curve = run.curve("test_acc")
                sent = run.cumulative("bytes_sent")
                acc = [100 * v for v in curve.values()]
                axes[0, col].plot(list(curve), acc, label=f"m = {m}")
                axes[1, col].plot([sent[k] / MIB for k in curve], acc, "o-", ms=3, label=f"m = {m}")
            axes[0, col].set(xlabel="round", title=title)
            axes[1, col].set(xlabel="MiB sent by all peers (cumulative)", title=f"{title}, by traffic")
            for ax in axes[:, col]:
                ax.grid(alpha=0.3)
                ax.legend(loc="lower right")
        for ax in axes[:, 0]:
            ax.set_ylabel("aggregated test accuracy (%)")
        self.save(
            fig,
            "fig13_batching_subsampling",
            "Figs. 13-14: NTK-DFL with m1 Jacobian batches per round (left) "
            "and 1/m2 of the samples per round (right), by round (top) and by bytes sent (bottom). Runs: "
            f"alpha0.1/ntk-dfl, batches{{2,4}}/ntk-dfl, subsample{{2,4}}/ntk-dfl ({self.scale(runs[names[0]])}).",
        )

    # figs. 15-16: compression against bytes, and bytes to accuracy thresholds
    def compression(self) -> None:
        names = [FAMILY + c for c in COMPRESSION]
        runs = self.need("fig15_compression_bytes", names)
        if runs is None:
            return
        fig, axes = plt.subplots(1, 2, figsize=(14, 4.8))
        curves = {}  # label -> (MiB by round, accuracy by round)
        for name in names:
            run, label = runs[name], name.removeprefix(FAMILY)
            rounds = sorted(run.curve("test_acc"))
            acc = [run.curve("test_acc")[k] for k in rounds]
            curves[label] = ([run.cumulative("bytes_sent")[k] / MIB for k in rounds], acc)
            if label == "dense":
                curves["dense"] = ([run.cumulative("bytes_dense")[k] / MIB for k in rounds], acc)
                curves["dense, factored message (lossless)"] = (
                    [run.cumulative("bytes_sent")[k] / MIB for k in rounds],
                    acc,
                )
        palette = iter(["tab:green", "tab:purple", "tab:brown", "tab:olive", "tab:cyan", "tab:pink", "tab:gray"])
        fixed = {"dense": "tab:red", "dense, factored message (lossless)": "tab:orange", "dfedavg": "tab:blue"}
        for label, (mib, acc) in curves.items():
            axes[0].plot(mib, [100 * a for a in acc], "o-", ms=3, label=label, color=fixed.get(label) or next(palette))
        axes[0].set_xscale("log")
        axes[0].set(
            xlabel="MiB sent by all peers (cumulative, log)",
            ylabel="aggregated test accuracy (%)",
            title="NTK-DFL variants by traffic",
        )
        finals = [curves[k][1][-1] for k in ("dense", "dfedavg")]
        thresholds = np.linspace(0.6 * min(finals), min(finals), 4).round(3)
        width = 0.38
        for i, (label, color) in enumerate((("dense", "tab:red"), ("dfedavg", "tab:blue"))):
            mib, acc = curves[label]
            reached = [next((m for m, a in zip(mib, acc) if a >= t), np.nan) for t in thresholds]
            axes[1].bar(
                np.arange(len(thresholds)) + (i - 0.5) * width,
                reached,
                width,
                color=color,
                label="ntk-dfl (dense Jacobians)" if label == "dense" else label,
            )
        axes[1].set_xticks(range(len(thresholds)), [f"{100 * t:.1f}%" for t in thresholds])
        axes[1].set_yscale("log")
        axes[1].set(
            xlabel="accuracy threshold",
            ylabel="MiB sent to reach it (log)",
            title="traffic to a threshold: NTK-DFL vs DFedAvg",
        )
        for ax in axes:
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=8)
        self.save(
            fig,
            "fig15_compression_bytes",
            "Figs. 15-16: NTK-DFL uncompressed (dense Jacobians; the factored "
            "message carries the same information), with inputs projected to 100 dimensions, 8-bit quantisation, "
            "top-k 10% and data subsampling m2 = 2, against DFedAvg, by bytes sent. Runs: "
            f"compression/{{{','.join(COMPRESSION)}}} ({self.scale(runs[names[0]])}, "
            f"kappa {runs[names[0]].config['kappa']:g}).",
        )

    def draw_all(self) -> dict[str, str]:
        self.out.mkdir(parents=True, exist_ok=True)
        for draw in (
            self.convergence,
            self.aggregation_gain,
            self.topology_and_sparsity,
            self.final_averaging,
            self.averaging_ablation,
            self.variance,
            self.batching,
            self.compression,
        ):
            draw()
        lines = [f"- **{name}.png**: {caption}" for name, caption in self.captions.items()]
        lines += [f"- {name}: skipped, missing {', '.join(missing)}" for name, missing in self.skipped.items()]
        (self.out / "captions.md").write_text("# NTK-DFL figures\n\n" + "\n".join(lines) + "\n")
        return self.captions


def main(argv: list[str] | None = None) -> int:
    return guarded("analysis figures", lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    """Every figure whose runs are there; a folder with none of them is refused in one line (exit 2)."""
    p = Parser(prog="python -m analysis figures", description=__doc__.split("\n\n")[0])
    p.add_argument("runs_dir", type=Path, help="folder holding the figure runs (launch.figures' output)")
    p.add_argument("--out", type=Path, help="where the PNGs go (default RUNS_DIR/figures)")
    args = p.parse_args(argv)
    runs_dir, out = args.runs_dir, args.out
    if not runs_dir.is_dir():
        raise UserError(f"{runs_dir} is not a folder of figure runs (python -m launch.figures makes one)")
    if not any((runs_dir / name / "metrics.jsonl").is_file() for name in figure_runs()):
        raise UserError(
            f"{runs_dir} holds none of the figures' runs (such as {next(iter(figure_runs()))}/); "
            "python -m launch.figures makes them"
        )
    figures = Figures(runs_dir, out or runs_dir / "figures")
    drawn = figures.draw_all()
    for name in drawn:
        print(f"drew {figures.out / name}.png")
    for name, missing in figures.skipped.items():
        print(f"skipped {name}: missing {', '.join(missing)}")
    return 0 if drawn and not figures.skipped else 1
