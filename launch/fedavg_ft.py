"""FedAvg with fine-tuning against its D-GD / D-SGD baseline, side by side (Collins et al. 2022).

    python -m launch.fedavg_ft fedavg-ft-linear [--out DIR] [--jobs 2]
    python -m launch.fedavg_ft fedavg-ft-fmnist-reduced

The preset (TOML) has [common] settings and one table per method ([fedavg] and [baseline]). Both runs
go to OUT/<method>/; OUT gets the paper's figures with both curves (linear-rep: rep_dist.png = fig. 1,
grad_norm.png = fig. 3 left, finetune_error.png = fig. 3 right; networks: fine_tuning.png = fig. 5 and
feature_similarity.png = fig. 4), a Markdown table (table.md) and the issue's targets checked in the
runs' own numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from p2pfl.measure.figures import plot_fine_tuning, plot_linear_run, plot_similarity  # noqa: E402
from p2pfl import presets  # noqa: E402
from launch.table import flags, run_all, run_command  # noqa: E402
from analysis.toolkit import read_rows  # noqa: E402


def cell(entry: dict, scale: float = 1, fmt: str = ".4g") -> str:
    if entry["mean"] is None:
        return "diverged"
    text = f"{scale * entry['mean']:{fmt}} ± {scale * entry['std']:.2g}"
    return text + (f" ({entry['diverged']} diverged)" if entry.get("diverged") else "")


def beats(a: dict, b: dict, lower_is_better: bool) -> bool:
    """a's mean beats b's (is below it for errors, above it for accuracies), a diverged run counting as
    the worst."""
    if a["mean"] is None:
        return False
    return b["mean"] is None or (a["mean"] < b["mean"] if lower_is_better else a["mean"] > b["mean"])


def runs_of(preset: dict, out: Path) -> list[dict]:
    """The two runs (FedAvg and its baseline): their folders and command lines."""
    return [
        {
            "column": "",
            "method": m,
            "lr": None,
            "folder": out / m,
            "argv": run_command(
                [
                    "--algo",
                    "fedavg-ft",
                    *flags({**preset.get("common", {}), **{k: v for k, v in preset[m].items() if k != "label"}}),
                ],
                out / m,
            ),
        }
        for m in ("fedavg", "baseline")
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("preset")
    p.add_argument("--out", help="output folder (default runs/<preset name>)")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    args = p.parse_args(argv)
    path = presets.find(args.preset, "experiment")
    preset = tomllib.loads(path.read_text())
    out = Path(args.out or Path("runs") / path.stem)
    methods = ("fedavg", "baseline")
    runs = runs_of(preset, out)
    if any(run_all(runs, args.jobs)):
        return 1
    finals = {m: json.loads((out / m / "final.json").read_text()) for m in methods}
    labels = {m: preset[m].get("label", m) for m in methods}
    fa, base = finals["fedavg"]["fine_tuning"], finals["baseline"]["fine_tuning"]
    linear = "final_rep_dist" in finals["fedavg"]
    lines = [f"{preset.get('title', out.name)}", ""]
    if linear:
        rows = {m: [r for r in read_rows(out / m / "metrics.jsonl")] for m in methods}
        plot_linear_run({labels[m]: (rows[m], finals[m]["fine_tuning"]) for m in methods}, out)
        lines += ["| n | " + " | ".join(f"{labels[m]} error (mean ± std)" for m in methods) + " |", "|---|---|---|"]
        lines += [f"| {n} | " + " | ".join(cell(finals[m]["fine_tuning"][n]) for m in methods) + " |" for n in fa]
        checks = {
            f"{labels['fedavg']} dist(B_T, B*) = {finals['fedavg']['final_rep_dist']:.3g} < 1e-3": finals["fedavg"][
                "final_rep_dist"
            ]
            < 1e-3,
            f"{labels['baseline']} dist(B_T, B*) = {finals['baseline']['final_rep_dist']:.3g} > 0.9": finals[
                "baseline"
            ]["final_rep_dist"]
            > 0.9,
            "fine-tuning error of FedAvg below the baseline's at every n": all(
                beats(fa[n], base[n], lower_is_better=True) for n in fa
            ),
        }
    else:
        for m in methods:
            plot_similarity(
                np.array(finals[m]["feature_similarity"]),
                out / f"feature_similarity_{m}.png",
                f"{labels[m]}: feature cosine similarity by class",
            )
        if fa:
            plot_fine_tuning(
                {labels[m]: finals[m]["fine_tuning"] for m in methods}, out / "fine_tuning.png", "accuracy"
            )
        lines += ["| n | " + " | ".join(f"{labels[m]} accuracy (mean ± std)" for m in methods) + " |", "|---|---|---|"]
        lines += [
            f"| {n} | " + " | ".join(cell(finals[m]["fine_tuning"][n], 100, ".2f") for m in methods) + " |" for n in fa
        ]
        checks = (
            {
                "fine-tuned accuracy of FedAvg above the baseline's at every n": all(
                    beats(fa[n], base[n], lower_is_better=False) for n in fa
                )
            }
            if fa
            else {}
        )
        for m in methods:
            sim = np.array(finals[m]["feature_similarity"])
            off = sim[~np.eye(len(sim), dtype=bool)]
            lines.append(
                f"{labels[m]}: feature similarity within a class {np.nanmean(np.diag(sim)):.3f}, "
                f"between classes {np.nanmean(off):.3f}"
            )
    lines += ["", *[f"{'PASS' if ok else 'FAIL'}: {text}" for text, ok in checks.items()]]
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
