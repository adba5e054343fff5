"""The run's graph from its settings: a registered family by name, the user's own function
(--topology package.module:function) or a file (--topology-file), with the checks that relate the graph
to the algorithm and the mixing weights, made before any data is read."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from p2pfl.algorithms import REGISTRY
from p2pfl.errors import UserError
from p2pfl.measure.graph_diagnostics import keeps_mean, mixing_matrix
from p2pfl.plugins import call_plugin, is_reference, load_function
from p2pfl.runner.paths import resolved
from p2pfl.seeding import graph_seeds
from topologies import FAMILIES, Family, GraphError, GraphSpec, TopologySchedule, fingerprint
from topologies.given import file_family, function_family

FROM_FILE = "file"  # --topology's value where --topology-file names the graph


def choices_sentence() -> str:
    return (
        f"one of: {', '.join(FAMILIES)}; or package.module:function, your own function(peers, round, seed) "
        "returning a networkx graph; or --topology-file"
    )


def describe(cfg) -> str:
    """The graph in a few words, for titles: 'regular kappa=5', 'torus', 'file edges.txt': the settings
    its family reads, where given."""
    if cfg.topology_file is not None:
        return f"file {Path(cfg.topology_file).name}"
    family = FAMILIES.get(cfg.topology)
    read = [(name, getattr(cfg, name)) for name in (family.reads if family is not None else ())]
    return " ".join(
        [
            cfg.topology,
            *(
                f"{name}={value:g}" if isinstance(value, float | int) else f"{name}={value}"
                for name, value in read
                if value != ""
            ),
        ]
    )


def graph_spec(cfg) -> GraphSpec:
    return GraphSpec(cfg.kappa, cfg.torus_sides, cfg.rewire, cfg.exponential_form, cfg.topology_window)


def family_of(cfg) -> Family:
    """The family --topology (or --topology-file) names, or one UserError line."""
    if cfg.topology_file is not None:
        return _refusing(file_family, Path(cfg.topology_file), cfg.mixing == "given")
    if is_reference(cfg.topology):
        where = f"--topology {cfg.topology}"
        function = load_function(cfg.topology, "--topology", "peers", "round", "seed")
        return function_family(
            lambda n, k, seed: call_plugin(where, function, n, k, seed), where, cfg.mixing == "given"
        )
    if cfg.topology == FROM_FILE:
        raise UserError("--topology file reads the graph of --topology-file PATH; give that file")
    if cfg.topology not in FAMILIES:
        raise UserError(f"unknown topology {cfg.topology!r}; choose {choices_sentence()}")
    return FAMILIES[cfg.topology]


def schedule_of(cfg, peers: int) -> TopologySchedule:
    return _refusing(TopologySchedule, family_of(cfg), peers, graph_spec(cfg), graph_seeds(cfg.seed), cfg.static)


def settle(cfg) -> None:
    """Settings that follow from the topology: --topology-file's name, a family's own default degree."""
    if cfg.topology_file is not None:
        if "topology" in cfg.given and cfg.topology != FROM_FILE:
            raise UserError(f"give --topology {cfg.topology} or --topology-file, not both")
        if cfg.algorithm.centralized:
            raise UserError(f"--topology-file: --algo {cfg.algo} runs on a star around its server; it takes no graph")
        cfg.topology = FROM_FILE
        cfg.topology_file = resolved(cfg.topology_file, "--topology-file")
        cfg.static = True  # a file is one graph: config.toml says so
    family = FAMILIES.get(cfg.topology)
    if cfg.topology_window != 1 and not is_reference(cfg.topology):
        raise UserError(
            f"--topology-window applies to a function's graphs (--topology package.module:function), not {cfg.topology}"
        )
    for f in dataclasses.fields(GraphSpec):  # --kappa: every config.toml holds it; the window: checked above
        unread = family is None or f.name not in family.reads
        if f.name not in ("kappa", "topology_window") and getattr(cfg, f.name) != f.default and unread:
            readers = ", ".join(name for name, other in FAMILIES.items() if f.name in other.reads)
            raise UserError(f"--{f.name.replace('_', '-')} applies to --topology {readers}, not {cfg.topology}")
    if family is not None and family.kappa is not None and "kappa" not in cfg.given:
        cfg.kappa = family.kappa


def check_topology(cfg, peers: int) -> None:
    """The graph against the algorithm and the mixing, before any data is read. A built-in family is
    checked by its settings (drawing 10^8 peers' graph to look at it would take the machine's memory);
    a user's graph, a function's or a file's, is drawn for the first round and checked where it enters."""
    schedule = schedule_of(cfg, peers)
    family = FAMILIES.get(cfg.topology)  # None for a function's graph and a file's (--topology file)
    directed = family.directed(graph_spec(cfg)) if family is not None else _refusing(schedule.graph, 0).is_directed()
    if cfg.topology_window > 1 and (cfg.rounds or cfg.topology_window) >= cfg.topology_window:  # the first window
        _refusing(schedule.graph, cfg.topology_window - 1)
    where = graph_source(cfg)
    if directed:
        if not cfg.algorithm.directed_graphs:
            able = ", ".join(name for name, cls in REGISTRY.items() if cls.directed_graphs)
            raise UserError(
                f"{where} is directed (each peer hears its in-neighbours only); --algo {cfg.algo} needs symmetric "
                f"exchanges. Directed graphs run {able}"
                + ("; or use --exponential-form symmetric" if cfg.topology == "exponential" else "")
            )
        if cfg.mixing == "metropolis":
            raise UserError(f"--mixing metropolis needs an undirected graph; {where} is directed (use uniform)")
    if cfg.mixing is None:  # the algorithm's, where the graph allows it: metropolis is for undirected graphs
        cfg.mixing = "uniform" if directed else cfg.algorithm.mixing
    if cfg.mixing == "given" and family is not None:
        raise UserError(f"--mixing given reads the weights on the edges of your own graph; {where}'s carry none")
    if directed and not cfg.algorithm.push_sum:
        check_keeps_mean(cfg, schedule, family, where)
    if cfg.algorithm.needs_static_graph(cfg.settings) and schedule.varies:
        why = (
            "is new each round without --static"
            if family is not None and not family.by_round
            else "changes every round by definition"
            if family is not None
            else "may change each round (write it to a --topology-file)"
        )
        raise UserError(
            f"--algo {cfg.algo}{'' if cfg.algorithm.static_graph else ' with a gossip codec'} keeps state over a fixed "
            f"set of neighbours: it needs a static graph, and {where} {why}"
        )
    cfg.notes = mixing_notes(cfg, schedule, peers)


def graph_source(cfg) -> str:
    """The flag and value the run's graph comes from, for its error lines."""
    return f"--topology-file {cfg.topology_file}" if cfg.topology_file else f"--topology {cfg.topology}"


def check_keeps_mean(cfg, schedule: TopologySchedule, family: Family | None, where: str) -> None:
    """On a directed graph, averaging keeps the peers' mean only where W's columns also sum to 1; else it
    converges to a weighted mean, silently. The built-in directed families are regular (as many in- as
    out-neighbours), so uniform weights keep it; any other pairing is drawn for the first round and looked at."""
    if family is not None and cfg.mixing == "uniform":
        return
    why = "they follow the peers' sample counts"
    if cfg.mixing != "sample-weighted":
        matrix = mixing_matrix(_refusing(schedule.graph, 0), cfg.mixing)
        if keeps_mean(matrix):
            return
        why = f"W's columns sum to {matrix.sum(0).min():.3g} .. {matrix.sum(0).max():.3g}"
    raise UserError(
        f"{where} is directed and its --mixing {cfg.mixing} weights are not doubly stochastic ({why}): --algo "
        f"{cfg.algo} would average to a weighted mean, not the mean. Use --algo sgp (push-sum corrects it), or "
        "--mixing given with weights whose columns sum to 1"
    )


def mixing_notes(cfg, schedule: TopologySchedule, peers: int) -> tuple[str, ...]:
    """The run header's line where round 1's W may not keep the peers' mean (then no spectral gap is
    reported), from the graph drawn before any data is read."""
    mean = (
        ""
        if cfg.algorithm.push_sum
        else "; averaging then reaches a weighted mean of the peers (metropolis keeps the mean)"
    )
    if cfg.mixing == "sample-weighted":  # the counts are not known before the data is read
        return (f"--mixing sample-weighted: W is not doubly stochastic where the peers' sample counts differ{mean}",)
    if peers > 100_000 or keeps_mean(mixing_matrix(_refusing(schedule.graph, 0), cfg.mixing)):  # too large to draw
        return ()
    return (
        f"--mixing {cfg.mixing}: round 1's W is not doubly stochastic on this graph, so no spectral_gap is reported{mean}",
    )


def check_same_graph(ctx, round_index: int, first: int) -> None:
    """Before round k's exchanges: every rank drew the same graph (each draws its own copy), or every rank
    stops with one line. A user's function that reads the rank, the process or unseeded randomness, or a
    file changed while the ranks started, would otherwise give wrong numbers or a wait for messages never
    sent. Compared in the run's first round, and in each later one where a user's function draws the graph
    anew (a built-in family is p2pfl's own seeded code: checked once, its edges not sorted every round at
    10^5 peers)."""
    transport, schedule = ctx.transport, ctx.schedule
    if transport.size == 1 or ctx.cfg.algorithm.centralized:
        return
    if round_index > first and (not schedule.varies or ctx.cfg.topology in FAMILIES):
        return
    digests = transport.gather(fingerprint(schedule.graph(round_index), ctx.cfg.mixing == "given"))
    differ = transport.bcast([r for r, d in enumerate(digests) if d != digests[0]] if digests is not None else None)
    if differ:
        why = (
            "was it changed while the ranks started?"
            if ctx.cfg.topology_file
            else "each rank calls it, so it must return the same graph for the same (peers, round, seed): "
            "no unseeded randomness, rank or process id"
        )
        raise UserError(
            f"{graph_source(ctx.cfg)} gave rank{'s' if len(differ) > 1 else ''} {', '.join(map(str, differ[:5]))} a graph "
            f"other than rank 0's in round {round_index + 1}: {why}"
        )


def _refusing(function, *args):
    """function(*args), a GraphError as one UserError line."""
    try:
        return function(*args)
    except GraphError as exc:
        raise UserError(str(exc)) from None
