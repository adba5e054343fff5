"""Views of a run's topology that read at the papers' scale (300 peers).

    python -m analysis topology RUN_DIR_OR_CONFIG [--rounds R] [--peer P] [--out DIR]
    python -m analysis graph --topology torus --peers 16 [any graph flag of p2pfl.run] [--out DIR]

Takes a run folder (its config.toml) or a run config (TOML, e.g. p2pfl/presets/*.toml) and draws, for
the graphs of its rounds (a pure function of seed and round, so nothing needs to have run): the
adjacency matrix of round 1 (a built-in family's ordered by placement, a user's by peer), the first rounds as small multiples, the degree and
spectral-gap histograms over the rounds, and one peer's neighbourhood across rounds. `graph` takes the
graph's flags themselves (a family, --topology-file, a function; --mixing, --algo for its default mixing)
and prints its mixing matrix W and spectral gap, and a time-varying family's per-round rate over one
period, before any run.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from analysis.toolkit import Parser, guarded, output_folder, provenance_of, read_toml, writable
from p2pfl.runner import provenance
from p2pfl.runner.configure import parse_config, resolve
from p2pfl.measure.graph_diagnostics import graph_gap, mixing_matrix, period_gap
from p2pfl.errors import UserError
from p2pfl.runner.graph_schedule import describe, schedule_of
from topologies.drawing import draw_views


MAX_ROUNDS = 1000  # every round's graph is built and measured: beyond this it takes minutes for nothing new


def main(argv: list[str] | None = None) -> int:
    return guarded("analysis topology", lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    p = Parser(prog="python -m analysis topology", description=__doc__.split("\n\n")[0])
    p.add_argument("source", type=Path, help="a run folder or a run config (TOML)")
    p.add_argument("--rounds", type=int, help="rounds to look at (default: the run's, at most 100)")
    p.add_argument("--peer", type=int, default=0, help="the peer whose neighbourhood is drawn (default 0)")
    p.add_argument("--out", type=Path, help="folder for the PNGs (default RUN_DIR/topology, or ./topology-<name>)")
    args = p.parse_args(argv)
    config = args.source / "config.toml" if args.source.is_dir() else args.source
    if args.source.is_dir() and not config.is_file():
        raise UserError(f"{args.source} is not a run folder (no config.toml)")
    cfg = resolve(parse_config(["--config", str(config)]), 1)
    changed = (  # a run folder's config.toml records its graph file's digest; a preset's does not
        provenance.changed_input(provenance_of(read_toml(config, "run config"), config.parent), cfg)
        if args.source.is_dir()
        else None
    )
    if changed:
        raise UserError(
            f"{changed} changed since the run read it (its SHA-256 is not the one config.toml records): the "
            "views would be of another graph; put the run's file back"
        )
    if cfg.topology == "star":
        raise UserError("a centralized run's star has no rounds to compare; its topology.png shows it")
    rounds = args.rounds if args.rounds is not None else min(cfg.rounds, 100)
    if not 1 <= rounds <= MAX_ROUNDS:
        raise UserError(f"--rounds must be in [1, {MAX_ROUNDS}]")
    if not 0 <= args.peer < cfg.peers:
        raise UserError(f"--peer must be in [0, {cfg.peers})")
    out = output_folder(
        args.out or (args.source / "topology" if args.source.is_dir() else Path(f"topology-{config.stem}"))
    )
    counts = None
    if cfg.mixing == "sample-weighted":  # the weights need every peer's sample count: a run folder has them
        partition = args.source / "partition.json"
        if not partition.exists():
            raise UserError(
                "--mixing sample-weighted needs the peers' sample counts: give a run folder (partition.json)"
            )
        counts = [peer["samples"] for peer in json.loads(partition.read_text())]
    draw(cfg, rounds, args.peer, out, counts)
    return 0


def draw(cfg, rounds: int, peer: int, out: Path, counts: list[int] | None = None) -> None:
    """The gap of each of the first rounds' W printed in one line, and the views drawn into out."""
    schedule = schedule_of(cfg, cfg.peers)
    title = f"{describe(cfg)}, {cfg.peers} peers, {'new graph each round' if schedule.varies else 'static'}, seed {cfg.seed}"
    gaps = [graph_gap(schedule.graph(k), cfg.mixing, counts) for k in range(rounds)]
    if None in gaps:
        print(f"the {cfg.mixing} mixing matrix does not keep the peers' mean on this graph: no spectral gap")
    else:
        said = (
            f"{gaps[0]:.6g}"
            if len(set(gaps)) == 1
            else f"mean {sum(gaps) / len(gaps):.6g}, min {min(gaps):.6g}, max {max(gaps):.6g}"
        )
        print(f"spectral gap of the {cfg.mixing} mixing matrix over {rounds} round{'s' * (rounds > 1)}: {said}")
    for path in draw_views(schedule.graph, [g if g is not None else float("nan") for g in gaps], out, title, peer):
        print(f"drew {path}")


GRAPH_ROUNDS = 20  # rounds of a graph that changes, looked at by `graph` unless --rounds says otherwise
SHOWN_W = 16  # peers up to which `graph` prints W itself (larger: W.csv only)


def graph_main(argv: list[str] | None = None) -> int:
    return guarded("analysis graph", lambda: _graph(argv))


def _graph(argv: list[str] | None) -> int:
    p = Parser(
        prog="python -m analysis graph",
        description="A graph's mixing matrix, spectral gap and views, from p2pfl.run's graph flags, without a run.",
    )
    p.add_argument("--rounds", type=int, help=f"rounds to look at (default: 1 for a static graph, else {GRAPH_ROUNDS})")
    p.add_argument("--peer", type=int, default=0, help="the peer whose neighbourhood is drawn (default 0)")
    p.add_argument("--out", type=Path, help="folder for W.csv and the PNGs (default ./graph-<topology>-<peers>)")
    args, flags = p.parse_known_args(argv)
    if not any(f.split("=")[0] in ("--topology", "--topology-file") for f in flags):
        raise UserError("name the graph: --topology NAME (or package.module:function) or --topology-file PATH")
    cfg = resolve(parse_config(["--dataset", "synthetic", *flags]), 1)
    if cfg.algorithm.centralized:
        raise UserError(f"--algo {cfg.algo} runs on a star around its server; name a graph algorithm or none")
    schedule = schedule_of(cfg, cfg.peers)
    rounds = args.rounds if args.rounds is not None else (GRAPH_ROUNDS if schedule.varies else 1)
    if not 1 <= rounds <= MAX_ROUNDS:
        raise UserError(f"--rounds must be in [1, {MAX_ROUNDS}]")
    if not 0 <= args.peer < cfg.peers:
        raise UserError(f"--peer must be in [0, {cfg.peers})")
    name = re.sub(r"[^A-Za-z0-9.-]+", "-", describe(cfg)).strip("-")
    out = output_folder(args.out or Path(f"graph-{name}-{cfg.peers}"))
    writable(out)
    matrix = mixing_matrix(schedule.graph(0), cfg.mixing)
    np.savetxt(out / "W.csv", matrix, delimiter=",", fmt="%.10g")
    print(f"{describe(cfg)}, {cfg.peers} peers, --mixing {cfg.mixing}: W of round 1 in {out / 'W.csv'}")
    if cfg.peers <= SHOWN_W:
        print(np.array2string(matrix, precision=3, suppress_small=True, max_line_width=200))
    period = schedule.family.period
    if period is not None:
        graphs = [schedule.graph(k) for k in range(period(cfg.peers))]
        rate = period_gap(graphs, cfg.mixing)
        print(
            f"one period of {len(graphs)} rounds mixes at a per-round rate of {rate:.6g} (1 - its product's "
            "distance from the average, per round: the gap a static graph would need to mix as fast)"
            if rate is not None
            else "its rounds' W do not keep the peers' mean: no period rate"
        )
    draw(cfg, rounds, args.peer, out)
    return 0
