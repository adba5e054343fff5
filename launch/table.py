"""A paper's result table from one experiment preset: every method on every column (data split).

    python -m launch.table tct-fmnist-reduced [--jobs 2] [--columns C1] [--out DIR]

The preset (TOML) has a [common] table of p2pfl settings for every run, one table per method (its
settings; `lrs = [...]` makes a grid whose best final test accuracy is reported, as papers that tune
the baselines' learning rate do) and a [columns] table naming each column's settings. An optional
top-level `metrics = [...]` names the metrics.jsonl fields to tabulate (default ["test_acc"]; the
first one picks the best lr: the largest, or the smallest for a loss or grad_norm); an optional `target =
0.7` adds, for each best run, the first evaluated round where that metric reaches it and the virtual
seconds it took (sim_time_s, p2pfl.comm.clock), to rank methods by time to a target. Every run gets its
own run folder under OUT/<column>/<method>[-lr<lr>]; a run whose metrics.jsonl already reaches its last round is not run again. Prints and writes
OUT/table.md (the final values, then every evaluated round of each column) and OUT/results.json
(best and every lr), OUT/table.png (the final values of the first metric as a heat map), and
OUT/<column>/comparison.png (the first metric per round, each method's best run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from p2pfl import presets  # noqa: E402
from analysis.plots import is_fraction, plot_comparison, plot_table  # noqa: E402
from analysis.toolkit import Parser, guarded, output_folder, read_rows, read_toml, writable  # noqa: E402
from p2pfl.errors import UserError  # noqa: E402
from p2pfl.threads import share_cores  # noqa: E402


def flags(settings: dict) -> list[str]:
    out = []
    for key, value in settings.items():
        if isinstance(value, bool):
            out += [f"--{key}"] if value else []
        elif isinstance(value, list):
            out += [f"--{key}", ",".join(str(v) for v in value)]
        else:
            out += [f"--{key}", str(value)]
    return out


def mpi_prefix(ranks: int) -> list[str]:
    """mpirun from the virtualenv with RANKS ranks (oversubscribed), or nothing for one process."""
    return [str(Path(sys.executable).parent / "mpirun"), "-n", str(ranks), "--oversubscribe"] if ranks > 1 else []


def run_command(args: list[str], folder: Path, ranks: int = 1) -> list[str]:
    """The command line of one p2pfl run into folder, without a progress bar."""
    return [*mpi_prefix(ranks), sys.executable, "-m", "p2pfl.run", *args, "--out", str(folder), "--no-progress"]


def runs_of(preset: dict, columns: list[str], out: Path) -> list[dict]:
    """Every (column, method, lr) run: its folder and its command line."""
    common = preset.get("common", {})
    methods = {k: v for k, v in preset.items() if k not in ("common", "columns", "title", "metrics", "target")}
    runs = []
    for column in columns:
        for method, settings in methods.items():
            settings = dict(settings)
            lrs = settings.pop("lrs", [settings.get("lr", common.get("lr"))])
            for lr in lrs:
                name = method if len(lrs) == 1 else f"{method}-lr{lr:g}"
                merged = {**common, **preset["columns"][column], **settings}
                if lr is not None:
                    merged["lr"] = lr
                folder = out / column / name
                runs.append(
                    {
                        "column": column,
                        "method": method,
                        "lr": lr,
                        "folder": folder,
                        "argv": run_command(flags(merged), folder),
                    }
                )
    return runs


def _settings(argv: list[str], ranks: int) -> dict:
    """The resolved settings of a planned run's command line (without its folder and output flags)."""
    from p2pfl.runner.configure import parse_config, resolve, resolved_dict

    args = list(argv[argv.index("p2pfl.run") + 1 :])
    i = args.index("--out")
    del args[i : i + 2]
    return resolved_dict(resolve(parse_config([a for a in args if a not in ("--no-progress", "--overwrite")]), ranks))


def _stored(folder: Path, ranks: int) -> dict:
    from p2pfl.runner.configure import load_toml, make_config, resolve, resolved_dict

    return resolved_dict(resolve(make_config(load_toml(str(folder / "config.toml"))), ranks))


NEUTRAL = {"progress", "comm_timeout", "checkpoint_every", "device", "save_edges"}  # the same run whatever these say


def ranks_of(argv: list[str]) -> int:
    """The MPI ranks of a run command (mpirun's -n before p2pfl.run), 1 without mpirun."""
    return int(argv[argv.index("-n") + 1]) if "-n" in argv[: argv.index("p2pfl.run")] else 1


def run_state(run: dict) -> str:
    """'done' (finished with these settings: skipped), 'resume' (stopped with a checkpoint: continued),
    or 'new' (run from the start, replacing an unfinished run's files). A folder holding a run of
    other settings (another preset swept into the same folder) is refused: its results would be
    reported under this plan's name."""
    from p2pfl.runner.checkpoint.files import has_checkpoint
    from p2pfl.runner.configure import first_difference

    folder, argv = Path(run["folder"]), run["argv"]
    if not (folder / "config.toml").is_file():
        return "new"
    ranks = ranks_of(argv)
    planned = _settings(argv, ranks)
    try:
        stored = _stored(folder, ranks)
    except UserError as exc:
        raise UserError(f"{folder} holds a run this p2pfl cannot read ({exc}); use another --out")
    k = first_difference(stored, planned, NEUTRAL)
    if k:
        raise UserError(
            f"{folder} holds a run of other settings ({k} {stored.get(k)!r} there, {planned.get(k)!r} "
            "in this plan); use another --out"
        )
    try:
        rows = read_rows(folder / "metrics.jsonl")  # never a pipe's endless wait
    except UserError:  # unreadable rows: no finished run
        rows = []
    if rows and rows[-1].get("round") == stored["rounds"] and (folder / "model.pt").exists():
        return "done"
    return "resume" if has_checkpoint(folder) else "new"


def run_all(runs: list[dict], jobs: int = 1) -> list[int]:
    """The runs, `jobs` at a time (a finished run is skipped); exit codes in plan order. Each process gets
    its share of the cores for its thread pool, where the environment sets none: two runs at a time on
    two cores with a pool of two each spun against each other (a D-PSGD round of 100 peers took 4.8 s
    where it takes 0.1 s on one thread each)."""
    jobs = max(1, jobs)
    with ThreadPoolExecutor(jobs) as pool:
        return list(pool.map(lambda run: execute(run, share=jobs), runs))


def execute(run: dict, share: int = 1) -> int:
    """One run (or its resume), its output to <folder>.log; `share`: how many runs share the cores now."""
    state = run.get("state") or run_state(run)
    if state == "done":
        return 0
    run["folder"].parent.mkdir(parents=True, exist_ok=True)
    log = run["folder"].parent / f"{run['folder'].name}.log"
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    share_cores(env, share * ranks_of(run["argv"]))
    # a stopped run continues from its checkpoint; one without a checkpoint runs again from the start
    argv = [*run["argv"], "--resume", str(run["folder"])] if state == "resume" else [*run["argv"], "--overwrite"]
    with log.open("a" if state == "resume" else "w") as fh:
        code = subprocess.run(argv, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT).returncode
    print(f"{'done' if code == 0 else f'FAILED ({code}), see ' + str(log)}: {run['folder']}", flush=True)
    return code


def final_value(folder: Path, key: str = "test_acc") -> float | None:
    rows = [r for r in read_rows(folder / "metrics.jsonl") if key in r] if (folder / "metrics.jsonl").exists() else []
    return rows[-1][key] if rows else None


def reaching(folder: Path, key: str, target: float) -> dict:
    """The first evaluated round whose key reaches target (at least it; at most, for a loss) and its virtual
    seconds (the clock's sim_time_s; None in rows from before it): what a preset's `target` ranks by."""
    for row in read_rows(folder / "metrics.jsonl") if (folder / "metrics.jsonl").exists() else []:
        value = row.get(key)
        if value is not None and (value <= target if lower_is_better(key) else value >= target):
            return {"rounds_to_target": row["round"], "sim_time_s_to_target": row.get("sim_time_s")}
    return {"rounds_to_target": None, "sim_time_s_to_target": None}


def lower_is_better(key: str) -> bool:
    """Whether the grid's best lr is the one that makes this metric smallest (a loss, a gradient norm)."""
    return "loss" in key or key in ("grad_norm", "consensus_distance")


def cell(key: str, value: float) -> str:
    """A table cell: a fraction (accuracy) as a percentage, any other metric (a loss, grad_norm) as it is."""
    return f"{100 * value:.2f}%" if is_fraction(key) else f"{value:.3g}"


def markdown(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join([f"| {' | '.join(header)} |", "|---" * len(header) + "|", *(f"| {' | '.join(r)} |" for r in rows)])


def per_round(results: dict, column: str, key: str) -> str:
    """Every evaluated round of a column: one row per round, one cell per method's best run."""
    curves = {
        m: {r["round"]: r[key] for r in read_rows(Path(e["folder"]) / "metrics.jsonl") if key in r}
        for m, e in results[column].items()
        if "folder" in e
    }
    rounds = sorted({k for c in curves.values() for k in c})
    return markdown(
        ["round", *curves],
        [[str(k), *(cell(key, c[k]) if k in c else "" for c in curves.values())] for k in rounds],
    )


def main(argv: list[str] | None = None) -> int:
    return guarded("launch.table", lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    p = Parser(prog="python -m launch.table", description=__doc__)
    p.add_argument("preset", help="experiment preset (TOML)")
    p.add_argument("--columns", help="comma-separated subset of the preset's columns (default all)")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1)")
    p.add_argument("--out", help="output folder (default runs/<preset name>)")
    args = p.parse_args(argv)
    args.preset = presets.find(args.preset, "experiment")
    preset = read_toml(args.preset, "experiment")
    if not isinstance(preset.get("columns"), dict) or not preset["columns"]:
        raise UserError(
            f"{args.preset} is not an experiment (no [columns] table): launch.table takes an "
            "experiment (python -m p2pfl.presets lists them); a run preset goes to python -m p2pfl.run --config or launch.sweep"
        )
    if args.jobs < 1:
        p.error("--jobs must be at least 1")
    columns = args.columns.split(",") if args.columns else list(preset["columns"])
    unknown = [c for c in columns if c not in preset["columns"]]
    if unknown:
        p.error(f"unknown column(s) {unknown}; the preset has {list(preset['columns'])}")
    out = output_folder(Path(args.out or Path("runs") / Path(args.preset).stem))
    runs = runs_of(preset, columns, out)
    for run in runs:  # every folder checked before any run starts
        run["state"] = run_state(run)
    writable(out)
    codes = run_all(runs, args.jobs)
    keys = preset.get("metrics", ["test_acc"])
    target = preset.get("target")
    results: dict = {}
    for run, code in zip(runs, codes):
        entry = results.setdefault(run["column"], {}).setdefault(run["method"], {"by_lr": {}})
        value = final_value(run["folder"], keys[0]) if code == 0 else None
        entry["by_lr"][str(run["lr"])] = value
        if code != 0:  # how it ended (3: stopped as diverging), unless another lr of its grid finished
            entry.setdefault("exit", code)
        best = entry.get(keys[0])
        if value is not None and (best is None or (value < best if lower_is_better(keys[0]) else value >= best)):
            entry.update(
                {key: final_value(run["folder"], key) for key in keys}, lr=run["lr"], folder=str(run["folder"])
            )
            if target is not None:  # the round and the virtual seconds it reached the target
                entry.update(reaching(run["folder"], keys[0], target))
    methods = list(dict.fromkeys(r["method"] for r in runs))
    sections = []
    for key in keys:
        cells = [
            [
                method,
                *(
                    cell(key, results[c][method][key])
                    if results[c][method].get(key) is not None
                    else f"failed (exit {results[c][method]['exit']})"
                    if "exit" in results[c][method]
                    else "-"  # the run did not write this metric
                    for c in columns
                ),
            ]
            for method in methods
        ]
        sections.append(f"final {key} (best lr of each grid by {keys[0]})\n\n{markdown(['method', *columns], cells)}")
    for key in ("rounds_to_target", "sim_time_s_to_target") if target is not None else ():
        cells = [
            [
                method,
                *(
                    f"{results[c][method][key]:.4g}" if results[c][method].get(key) is not None else "not reached"
                    for c in columns
                ),
            ]
            for method in methods
        ]
        sections.append(
            f"{key} ({keys[0]} {'<=' if lower_is_better(keys[0]) else '>='} {target:g})\n\n"
            + markdown(["method", *columns], cells)
        )
    table = "\n\n".join(sections)
    title = preset.get("title", Path(args.preset).stem)
    rounds = "\n\n".join(
        f"{column}: {keys[0]} at every evaluated round\n\n{per_round(results, column, keys[0])}" for column in columns
    )
    (out / "table.md").write_text(f"{title}\n\n{table}\n\n{rounds}\n")
    (out / "results.json").write_text(json.dumps(results, indent=1))
    finals = {m: {c: results[c][m].get(keys[0]) for c in columns} for m in methods}
    plot_table(finals, out / "table.png", keys[0], title)  # the final values at a glance
    for column in columns:
        best = {m: read_rows(Path(e["folder"]) / "metrics.jsonl") for m, e in results[column].items() if "folder" in e}
        plot_comparison(best, out / column / "comparison.png", key=keys[0], title=f"{title}: {column}")
    print(f"{title}\n\n{table}\n\n{out / 'table.md'}")
    return 0 if all(c == 0 for c in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
