"""The papers' headline results beside p2pfl's, from run folders: docs/reproduce.md.

    python -m launch.reproduce run [--claims ntk-dfl,tct] [--jobs 2] [--max-minutes 20]  # the runs left
    python -m launch.reproduce page [--out docs/reproduce.md]                            # the page

launch/reproduce.toml lists the rows: a claim of a source paper, one method of it, the preset and seeds
that reproduce it and the metric that answers it (a metrics.jsonl field, or a final.json value). `run` starts every seed's run not finished yet
(runs/reproduce/<claim>/<method>/seed<S>), skipping rows whose stated minutes a run exceed
--max-minutes; `page` reads the run folders (metrics.jsonl, config.toml's [p2pfl] version, commit and
machine) and writes the page: mean and spread over the seeds that ran, the exact command, the time a
run took, and what a row not yet run takes.
"""

from __future__ import annotations

import functools
import json
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis.toolkit import Parser, guarded, provenance_of, read_json, read_rows, read_toml  # noqa: E402
from launch.experiment import experiment_runs  # noqa: E402
from launch.table import run_all, run_command, run_state  # noqa: E402
from p2pfl import presets  # noqa: E402
from p2pfl.errors import UserError  # noqa: E402

CLAIMS = ROOT / "launch" / "reproduce.toml"
RUNS = ROOT / "runs" / "reproduce"
PAGE = ROOT / "docs" / "reproduce.md"


@dataclass
class Row:
    claim: str
    paper: str
    headline: str
    method: str
    paper_value: str
    preset: str
    metric: str
    take: str
    page: str
    scale: str
    seeds: list[int]
    select: dict = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)
    minutes: float | None = None  # a run's time where it is known before running it

    def folder(self, seed: int, root: Path) -> Path:
        return root / self.claim / self.slug(self.method) / f"seed{seed}"

    @staticmethod
    def slug(method: str) -> str:
        return re.sub(r"[^a-z0-9]+", "-", method.lower()).strip("-")

    @functools.cached_property
    def args(self) -> list[str]:
        """The p2pfl.run arguments of the row's run without its seed and --out (expanded once: an
        experiment's runs are read from its file)."""
        path = presets.path_of(self.preset)
        if path is None:
            raise UserError(f"launch/reproduce.toml: no preset {self.preset} ({presets.LIST_COMMAND} lists them)")
        if path.parent != presets.EXPERIMENTS:
            return ["--config", self.preset, *self.flags]
        for run in experiment_runs(path, Path("out")):
            where = str(run["folder"].relative_to("out"))
            if all(run.get(k) == v for k, v in self.select.items() if k != "folder") and where.endswith(
                self.select.get("folder", "")
            ):
                argv = run["argv"]
                body = [*argv[argv.index("p2pfl.run") + 1 : argv.index("--out")], *argv[argv.index("--out") + 2 :]]
                if "--seed" in body:  # each row's seeds replace the experiment's
                    del body[body.index("--seed") : body.index("--seed") + 2]
                return [a for a in body if a != "--no-progress"] + self.flags
        raise UserError(f"launch/reproduce.toml: no run of {self.preset} matches {self.select}")

    def command(self, seed: int, root: Path) -> list[str]:
        return run_command([*self.args, "--seed", str(seed)], self.folder(seed, root))


TEXT_FIELDS = ("claim", "paper", "headline", "method", "paper_value", "preset", "metric", "take", "page", "scale")
FOLDER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # a claim names its runs' folder under --runs


def load_rows(path: Path = CLAIMS) -> list[Row]:
    """The rows, each claim's paper and headline carried down from its first row; each field checked for
    its type, and a claim for a folder name that stays under --runs."""
    rows, first = [], {}
    entries = read_toml(path, "--rows").get("row", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise UserError(f"--rows {path}: row is not a list of tables ([[row]])")
    for i, entry in enumerate(entries, 1):
        where = f"{path.name}, row {i} ({entry.get('claim', 'no claim')}, {entry.get('method', 'no method')})"
        head = first.setdefault(entry.get("claim"), entry)
        try:
            row = Row(**{"paper": head.get("paper"), "headline": head.get("headline"), **entry})
        except TypeError as exc:  # a field missing or unknown
            raise UserError(f"{where}: {exc}") from None
        check_row(row, where)
        rows.append(row)
    if not rows:
        raise UserError(f"{path.name}: no [[row]]")
    return rows


def check_row(row: Row, where: str) -> None:
    if row.paper is None or row.headline is None:
        raise UserError(f"{where}: a claim's first row names its paper and headline")
    wrong = next((name for name in TEXT_FIELDS if not isinstance(getattr(row, name), str)), None)
    if wrong:
        raise UserError(f"{where}: {wrong} is {getattr(row, wrong)!r}, not a string")
    if not isinstance(row.seeds, list) or not row.seeds or not all(_integer(s) for s in row.seeds):
        raise UserError(f"{where}: seeds is {row.seeds!r}, not a list of integers")
    if not isinstance(row.select, dict):
        raise UserError(f"{where}: select is {row.select!r}, not a table")
    if not isinstance(row.flags, list) or not all(isinstance(f, str) for f in row.flags):
        raise UserError(f"{where}: flags is {row.flags!r}, not a list of strings")
    if row.minutes is not None and (not isinstance(row.minutes, int | float) or isinstance(row.minutes, bool)):
        raise UserError(f"{where}: minutes is {row.minutes!r}, not a number")
    if not FOLDER_NAME.fullmatch(row.claim) or not Row.slug(row.method):
        raise UserError(
            f"{where}: a claim is a folder name under --runs (letters, digits, '.', '_', '-'), and a method "
            "holds a letter or digit"
        )
    if not (row.take in ("last", "best") or re.fullmatch(r"(rounds|sim_time)_to:0?\.\d+", row.take)):
        raise UserError(
            f"{where}: take is last, best, rounds_to:<fraction> or sim_time_to:<fraction>, not {row.take!r}"
        )


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def value_of(row: Row, records: list[dict], final: dict) -> float | None:
    """The row's number from one run: its metrics' last or best value, the first round at a target, or
    a value of final.json (metric "final:fine_tuning.10.mean")."""
    if row.metric.startswith("final:"):
        value = final
        for key in row.metric.removeprefix("final:").split("."):
            value = value.get(key) if isinstance(value, dict) else None
        return value
    values = [(r["round"], r[row.metric]) for r in records if r.get(row.metric) is not None]
    if not values:
        return None
    if row.take == "last":
        return values[-1][1]
    if row.take == "best":
        return max(v for _, v in values)
    target = float(row.take.partition(":")[2])
    reached = next((r for r in records if r.get(row.metric) is not None and r[row.metric] >= target), None)
    if reached is None:
        return None
    return reached["round"] if row.take.startswith("rounds_to") else reached.get("sim_time_s")


@dataclass
class Outcome:
    seed: int
    value: float | None  # None: the target was not reached (or the metric is missing)
    minutes: float
    source: dict  # config.toml's [p2pfl]
    best: float | None = None  # the metric's best value, shown where a target was not reached


def outcomes(row: Row, root: Path) -> list[Outcome]:
    """The seeds whose run finished; a run folder the tool cannot read is one line naming it."""
    found = []
    for seed in row.seeds:
        folder = row.folder(seed, root)
        if run_state({"folder": folder, "argv": row.command(seed, root)}) != "done":
            continue
        records = read_rows(folder / "metrics.jsonl")
        source = provenance_of(read_toml(folder / "config.toml", "run config"), folder)
        final = read_json(folder / "final.json", "final") if (folder / "final.json").exists() else {}
        minutes = sum(r.get("round_s", 0.0) for r in records) / 60
        values = [r[row.metric] for r in records if r.get(row.metric) is not None]
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            raise UserError(f"{folder}/metrics.jsonl: {row.metric} holds a value that is not a number")
        value = value_of(row, records, final)
        if value is not None and (not isinstance(value, int | float) or isinstance(value, bool)):
            raise UserError(f"{folder}: {row.metric} is {value!r}, not a number")
        found.append(Outcome(seed, value, minutes, source, max(values, default=None)))
    return found


def level(row: Row, value: float) -> str:
    """A value of the row's metric: accuracies in %."""
    if "acc" in row.metric or row.metric.startswith("final:fine_tuning"):
        return f"{100 * value:.1f}%"
    return f"{value:.4g}"


def shown(row: Row, value: float, averaged: bool = False) -> str:
    """A value as the page prints it; a mean or spread of rounds keeps one decimal."""
    if row.take.startswith("rounds_to"):
        return f"{value:.1f}" if averaged else f"{value:.0f}"
    if row.take.startswith("sim_time_to"):
        return f"{value:.3g} s"
    return level(row, value)


def summary(row: Row, found: list[Outcome]) -> str:
    """mean ± sd over the seeds (and each seed's value), or why there is none."""
    if not found:
        return "not run yet"
    values = [o.value for o in found if o.value is not None]
    missed = len(found) - len(values)
    if not values:
        bests = ", ".join(level(row, o.best) for o in found if o.best is not None)
        return f"target not reached in {len(found)} of {len(found)} runs" + (
            f" ({row.metric} at most {bests})" if bests else ""
        )
    mean, several = statistics.fmean(values), len(values) > 1
    spread = f" ± {shown(row, statistics.stdev(values), averaged=True).rstrip('%')}" if several else ""
    each = ", ".join(shown(row, v) if v is not None else "-" for v in (o.value for o in found))
    note = f"; not reached in {missed}" if missed else ""
    return f"**{shown(row, mean, averaged=several)}{spread}** ({each}{note})"


WHAT_A_COMMIT_SAYS = (
    "Each row names the commits its runs recorded; `+changes` marks a run whose checkout had tracked files "
    "edited since that commit (config.toml's `[p2pfl]` table)."
)


def page(rows: list[Row], root: Path, note: str = "") -> str:
    lines = [
        "# What p2pfl reproduces",
        "",
        "Each source paper's headline result beside p2pfl's, one row per method. p2pfl's number is the mean",
        "± the standard deviation over the seeds that ran (each seed's value in brackets). A reduced row runs",
        "the experiment at a scale this 2-core CPU finishes in minutes; the paper row of the same claim says",
        "what the paper's scale takes. Generated from the run folders by",
        "",
        "    python -m launch.reproduce run    # the runs not done yet (--claims, --max-minutes, --jobs)",
        "    python -m launch.reproduce page   # this page",
        "",
        "The details of each experiment, and the gaps' causes, are on the page each row links.",
        "",
        *([note, ""] if note else []),
    ]
    by_claim: dict[str, list[Row]] = {}
    for row in rows:
        by_claim.setdefault(row.claim, []).append(row)
    papers = list(dict.fromkeys(row.paper for row in rows))  # each paper's claims together, reduced first
    details, headed = [], set()
    for claim, members in sorted(by_claim.items(), key=lambda item: papers.index(item[1][0].paper)):
        head = members[0]
        if head.paper not in headed:
            headed.add(head.paper)
            lines += [f"## {head.paper}", ""]
        lines += [f"**{head.headline[0].upper()}{head.headline[1:]}** (`{claim}`)", ""]
        lines += ["| method | the paper | p2pfl | seeds | scale | a run took | version | details |"]
        lines += ["|---|---|---|---|---|---|---|---|"]
        for row in members:
            found = outcomes(row, root)
            took = (
                f"{statistics.fmean(o.minutes for o in found):.1f} min"
                if found
                else (f"about {row.minutes:g} min (not run)" if row.minutes else "-")
            )
            versions = sorted({o.source.get("version", "?") for o in found}) or ["-"]
            ran = {o.seed for o in found}
            left = [str(s) for s in row.seeds if s not in ran]
            seeds = ", ".join(str(o.seed) for o in found)
            if left:
                seeds = f"{seeds} ({', '.join(left)} not run)" if seeds else f"{', '.join(left)} not run"
            lines.append(
                f"| {row.method} | {row.paper_value or '-'} | {summary(row, found)} | {seeds} | {row.scale} | "
                f"{took} | {', '.join(versions)} | [{row.page}]({row.page}) |"
            )
            machines = sorted({o.source.get("machine", "?") for o in found})
            commits = sorted({re.sub(r"^([0-9a-f]{12})[0-9a-f]*", r"\1", o.source.get("commit", "?")) for o in found})
            details.append(
                f"- **{claim}, {row.method}** ({row.metric}, {row.take}): "
                f"`python -m p2pfl.run {' '.join(row.args)} --seed S`"
                + (f"; ran on {'; '.join(machines)}, commit {', '.join(commits)}" if found else "")
            )
        lines.append("")
    lines += ["## The commands and machines", "", WHAT_A_COMMIT_SAYS, "", *details, ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return guarded("launch.reproduce", lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    p = Parser(prog="python -m launch.reproduce", description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=("run", "page"))
    p.add_argument("--claims", help="comma-separated claims (default all)")
    p.add_argument("--rows", type=Path, default=CLAIMS, help=f"the rows' file (default {CLAIMS.name})")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1)")
    p.add_argument("--max-minutes", type=float, help="skip rows whose run is stated to take longer")
    p.add_argument("--seeds", help="comma-separated: run only these of each row's seeds (default all)")
    p.add_argument("--runs", type=Path, default=RUNS, help=f"folder of the runs (default {RUNS})")
    p.add_argument("--out", type=Path, default=PAGE, help=f"the page (default {PAGE})")
    p.add_argument("--note", default="", help="a paragraph under the page's introduction (how the runs were made)")
    args = p.parse_args(argv)
    args.runs = args.runs.resolve()  # from the working folder: the runs themselves start in the repository
    rows = load_rows(args.rows)
    if args.claims:
        wanted = set(args.claims.split(","))
        unknown = wanted - {r.claim for r in rows}
        if unknown:
            raise UserError(f"--claims: no claim {', '.join(sorted(unknown))} in {CLAIMS.name}")
        rows = [r for r in rows if r.claim in wanted]
    if args.action == "page":
        args.out.write_text(page(load_rows(args.rows), args.runs, args.note))
        print(f"launch.reproduce: wrote {args.out}")
        return 0
    only = {int(s) for s in args.seeds.split(",")} if args.seeds else None
    todo = [
        {"folder": row.folder(seed, args.runs), "argv": row.command(seed, args.runs)}
        for row in rows
        if args.max_minutes is None or (row.minutes or 0) <= args.max_minutes
        for seed in row.seeds
        if only is None or seed in only
    ]
    todo = [run for run in todo if run_state(run) != "done"]
    print(f"launch.reproduce: {len(todo)} runs to do", flush=True)
    failed = sum(bool(code) for code in run_all(todo, args.jobs))
    print(json.dumps({"runs": len(todo), "failed": failed}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
