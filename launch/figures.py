"""Run what the NTK-DFL paper's figures need, then draw them.

    python -m launch.figures ntk-dfl-figures-quick [--jobs 2] [--ranks N] [--out DIR]

The experiment file's [common] table sets the scale (peers, samples, rounds, ...), and its optional
[compression] table changes it for the compression runs; analysis.figures names the runs and what
each changes. Runs land in OUT/<name> (default runs/<experiment name>); a run
that already finished is skipped, an unfinished one is run again. Then `python -m analysis figures OUT`
draws OUT/figures/*.png with captions (OUT/figures/captions.md).
"""

from __future__ import annotations

import argparse
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from p2pfl import presets  # noqa: E402
from p2pfl.errors import UserError  # noqa: E402
from analysis.figures import FAMILY, Figures, figure_runs  # noqa: E402
from launch.sweep import check_plan, run_all  # noqa: E402
from launch.table import flags, run_command  # noqa: E402


def plan(experiment: dict, out: Path, ranks: int = 1) -> list[dict]:
    """Every figure run at the experiment's scale ([common], and [compression] on top of it for the
    compression family), NTK-DFL runs first: they are the slow ones, so parallel jobs end together."""
    runs = []
    for name, settings in figure_runs().items():
        scale = {**experiment["common"], **(experiment.get("compression", {}) if name.startswith(FAMILY) else {})}
        runs.append(
            {
                "folder": out / name,
                "argv": run_command(flags({**scale, **settings}), out / name, ranks),
                "slow": settings["algo"] == "ntk-dfl",
            }
        )
    return sorted(runs, key=lambda r: not r["slow"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m launch.figures", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("experiment", type=Path, help="TOML with a [common] table: the scale")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1)")
    p.add_argument("--ranks", type=int, default=1, help="MPI ranks per run (default 1)")
    p.add_argument("--out", type=Path, help="folder for the runs and figures (default runs/<experiment name>)")
    args = p.parse_args(argv)
    if args.jobs < 1 or args.ranks < 1:
        p.error("--jobs and --ranks must be at least 1")
    try:
        args.experiment = presets.find(args.experiment, "experiment")
        experiment = tomllib.loads(args.experiment.read_text())
        experiment["common"]
    except (OSError, tomllib.TOMLDecodeError, KeyError, UserError) as e:
        p.error(f"{args.experiment}: not an experiment file with a [common] table ({e})")
    out = args.out or ROOT / "runs" / args.experiment.stem
    runs = plan(experiment, out, args.ranks)
    problem = check_plan(runs)
    if problem:
        p.error(problem)
    start = time.monotonic()
    print(f"launch.figures: {len(runs)} runs into {out}", flush=True)
    codes = run_all(runs, args.jobs)
    failed = [str(r["folder"]) for r, code in zip(runs, codes) if code != 0]
    figures = Figures(out, out / "figures")
    drawn = figures.draw_all()
    print(
        f"launch.figures: {len(runs) - len(failed)}/{len(runs)} runs done, {len(drawn)} figures in "
        f"{out / 'figures'} ({time.monotonic() - start:.0f} s)"
    )
    for name, missing in figures.skipped.items():
        print(f"skipped {name}: missing {', '.join(missing)}")
    for folder in failed:
        print(f"FAILED: {folder} (see {folder}.log)")
    return 0 if not failed and not figures.skipped else 1


if __name__ == "__main__":
    sys.exit(main())
