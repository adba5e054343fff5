"""Run a grid of settings over seeds into one folder, then compare the runs.

    python -m launch.sweep PRESET --seeds 0,1,2 [--set key=v1,v2 ...] [--ranks N] [--jobs J] [--out DIR]

PRESET is a run config (TOML, or the name of a preset: python -m p2pfl.presets lists them). Every
combination of the --set values (keys are p2pfl flags without the dashes; values comma-separated) runs
once per seed, each in OUT/<key=value_...>/seed<s> (default OUT: runs/sweep-<preset name>). A run whose
metrics already reach its last round is skipped, and one stopped with a checkpoint is resumed, so an
interrupted sweep picks up where it stopped; an unfinished one without a checkpoint is run again from the
start. A folder holding a run of other settings (another preset swept into the same OUT) is refused. At the end `python -m analysis compare` draws OUT/compare.png
and writes OUT/compare.md and .csv, one group per combination.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from p2pfl import presets  # noqa: E402
from analysis.compare import compare  # noqa: E402
from analysis.toolkit import Parser, guarded, output_folder, read_toml, writable  # noqa: E402
from launch.table import run_all, run_command, run_state  # noqa: E402
from p2pfl.errors import UserError  # noqa: E402


def preset_path(name: str) -> Path:
    """A TOML path, or the name of a run preset."""
    path = presets.find(name)
    if not path.is_file():
        raise UserError(f"no preset {name!r} (a TOML file, or a name {presets.LIST_COMMAND} lists)")
    if "columns" in read_toml(path, "preset"):
        raise UserError(
            f"{name} is an experiment (it has [columns]): launch.table runs it; launch.sweep takes a run "
            "preset (one run's settings; python -m p2pfl.presets lists them)"
        )
    return path


def parse_sets(items: list[str]) -> dict[str, list[str]]:
    """['alpha=0.1,0.5', 'algo=ntk-dfl'] -> {'alpha': ['0.1', '0.5'], 'algo': ['ntk-dfl']}."""
    grid: dict[str, list[str]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip().lstrip("-")
        if not sep or not key or not values.strip():
            raise UserError(f"--set takes key=v1,v2, got {item!r}")
        if key.replace("-", "_") in ("seed", "out", "resume", "overwrite"):
            raise UserError(
                f"--set {key}: the sweep sets it itself ({'--seeds' if key == 'seed' else 'one folder a run'}); "
                f"{'give the seeds as --seeds ' + values.strip() if key == 'seed' else 'leave it out'}"
            )
        grid[key] = [v.strip() for v in values.split(",") if v.strip()]
    return grid


def plan(
    preset: Path,
    seeds: list[int],
    grid: dict[str, list[str]],
    out: Path,
    ranks: int = 1,
    flags: list[str] | None = None,
) -> list[dict]:
    """Every (combination, seed) run: its folder and command line (launch.table's run records)."""
    runs = []
    for combo in itertools.product(*grid.values()):
        settings = dict(zip(grid, combo))
        name = "_".join(f"{k}={v}" for k, v in settings.items()) or "base"
        for seed in seeds:
            folder = out / name / f"seed{seed}"
            args = [
                "--config",
                str(preset),
                "--seed",
                str(seed),
                *(a for k, v in settings.items() for a in (f"--{k}", v)),
                *(flags or []),
            ]
            runs.append({"folder": folder, "argv": run_command(args, folder, ranks)})
    return runs


def check_plan(runs: list[dict]) -> str | None:
    """The first run whose command line p2pfl would refuse, as its one-line error; None if all parse.
    Checked before anything runs, so a typo in --set is not found forty runs in."""
    from p2pfl.runner.configure import parse_config
    from p2pfl.errors import UserError

    for run in runs:
        argv = run["argv"][run["argv"].index("p2pfl.run") + 1 :]
        argv[argv.index("--out") + 1] = str(Path(run["folder"]).parent / "_check_")  # never made
        try:
            parse_config(argv)
        except UserError as e:
            return f"{run['folder']}: {e}"
    return None


def sweep_title(preset: Path, sets: list[str], extra: list[str]) -> str:
    """The preset and what the command changed in it, as typed (the figure's subtitle says what the runs
    were)."""
    changed = [f"--set {item}" for item in sets] + extra
    return f"sweep of preset {preset.stem}" + (f" with {' '.join(changed)}" if changed else "")


def main(argv: list[str] | None = None) -> int:
    return guarded("launch.sweep", lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    p = Parser(prog="python -m launch.sweep", description=__doc__)
    p.add_argument("preset", help="run config (TOML) or a run preset's name")
    p.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=V1,V2", help="a setting's values (repeatable)")
    p.add_argument("--ranks", type=int, default=1, help="MPI ranks per run (default 1: no mpirun)")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1)")
    p.add_argument("--out", type=Path, help="sweep folder (default runs/sweep-<preset name>)")
    p.add_argument("--target", help="target accuracies for the comparison table (default 0.8)")
    args, extra = p.parse_known_args(argv)
    preset = preset_path(args.preset)
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        p.error(f"--seeds takes integers, got {args.seeds!r}")
    if args.ranks < 1 or args.jobs < 1:
        p.error("--ranks and --jobs must be at least 1")
    if any(s < 0 for s in seeds):
        p.error(f"--seeds must be at least 0, got {args.seeds!r}")
    try:
        targets = [float(t) for t in args.target.split(",")] if args.target else None
    except ValueError:
        p.error(f"--target takes numbers, got {args.target!r}")
    out = output_folder(args.out or ROOT / "runs" / f"sweep-{preset.stem}")
    runs = plan(preset, seeds, parse_sets(args.set), out, args.ranks, extra)
    problem = check_plan(runs)
    if problem:
        p.error(problem)
    for run in runs:  # every folder checked before any run starts: skip, resume, or run
        run["state"] = run_state(run)
    writable(out)
    print(f"launch.sweep: {len(runs)} runs into {out}", flush=True)
    codes = run_all(runs, args.jobs)
    done = [run["folder"] for run, code in zip(runs, codes) if code == 0]
    if not done:
        print("launch.sweep: every run failed; see the .log files beside the run folders", file=sys.stderr)
        return 1
    compare(done, targets=targets, out=out / "compare.png", title=sweep_title(preset, args.set, extra))
    print((out / "compare.md").read_text(), end="")
    print(f"figure: {out / 'compare.png'}")
    return 0 if len(done) == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
