"""Views of a run's topology that read at the papers' scale (300 peers).

    python -m analysis topology RUN_DIR_OR_CONFIG [--rounds R] [--peer P] [--out DIR]

Takes a run folder (its config.toml) or a run config (TOML, e.g. p2pfl/presets/*.toml) and draws, for
the graphs of its rounds (a pure function of seed and round, so nothing needs to have run): the
adjacency matrix of round 1 ordered by peer, the first rounds as small multiples, the degree and
spectral-gap histograms over the rounds, and one peer's neighbourhood across rounds.
"""

from __future__ import annotations

import json
from pathlib import Path

from analysis.toolkit import Parser, guarded, output_folder, provenance_of, read_toml
from p2pfl.runner import provenance
from p2pfl.runner.configure import parse_config, resolve
from p2pfl.measure.graph_diagnostics import graph_gap
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
    changed = provenance.changed_input(provenance_of(read_toml(config, "run config"), config.parent), cfg)
    if changed and args.source.is_dir():
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
    schedule = schedule_of(cfg, cfg.peers)
    out = output_folder(
        args.out or (args.source / "topology" if args.source.is_dir() else Path(f"topology-{config.stem}"))
    )
    title = f"{describe(cfg)}, {cfg.peers} peers, {'static' if cfg.static else 'new graph each round'}, seed {cfg.seed}"
    counts = None
    if cfg.mixing == "sample-weighted":  # the weights need every peer's sample count: a run folder has them
        partition = args.source / "partition.json"
        if not partition.exists():
            raise UserError(
                "--mixing sample-weighted needs the peers' sample counts: give a run folder (partition.json)"
            )
        counts = [peer["samples"] for peer in json.loads(partition.read_text())]
    gaps = [graph_gap(schedule.graph(k), cfg.mixing, counts) for k in range(rounds)]
    said = (
        f"{gaps[0]:.6g}"
        if len(set(gaps)) == 1
        else f"mean {sum(gaps) / len(gaps):.6g}, min {min(gaps):.6g}, max {max(gaps):.6g}"
    )
    print(f"spectral gap of the {cfg.mixing} mixing matrix over {rounds} round{'s' * (rounds > 1)}: {said}")
    paths = draw_views(schedule.graph, gaps, out, title, args.peer)
    for path in paths:
        print(f"drew {path}")
    return 0
