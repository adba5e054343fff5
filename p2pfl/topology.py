"""The run's graph from its settings: a registered family by name, the user's own function
(--topology package.module:function) or a file (--topology-file), with the checks that relate the graph
to the algorithm and the mixing weights, made before any data is read."""

from __future__ import annotations

from pathlib import Path

from p2pfl.errors import UserError
from p2pfl.plugins import call_plugin, is_reference, load_object
from p2pfl.seeding import graph_seeds
from topologies import FAMILIES, Family, GraphError, GraphSpec, TopologySchedule
from topologies.given import file_family, function_family

FROM_FILE = "file"  # --topology's value where --topology-file names the graph


def choices_sentence() -> str:
    return (
        f"one of: {', '.join(FAMILIES)}; or package.module:function, your own function(peers, round, seed) "
        "returning a networkx graph; or --topology-file"
    )


DEGREE_READ_BY = ("regular", "erdos-renyi", "small-world")  # the families --kappa sets
READ_ONLY_BY = {"torus_sides": "torus", "rewire": "small-world", "exponential_form": "exponential"}


def describe(cfg) -> str:
    """The graph in a few words, for titles: 'regular kappa=5', 'torus', 'file edges.txt'."""
    if cfg.topology_file is not None:
        return f"file {Path(cfg.topology_file).name}"
    words = cfg.topology + (f" kappa={cfg.kappa:g}" if cfg.topology in DEGREE_READ_BY else "")
    if cfg.topology == "exponential":
        words += f" ({cfg.exponential_form})"
    if cfg.topology == "small-world":
        words += f" rewire={cfg.rewire:g}"
    return words


def graph_spec(cfg) -> GraphSpec:
    return GraphSpec(cfg.kappa, cfg.torus_sides, cfg.rewire, cfg.exponential_form)


def family_of(cfg) -> Family:
    """The family --topology (or --topology-file) names, or one UserError line."""
    if cfg.topology_file is not None:
        return _refusing(file_family, Path(cfg.topology_file), cfg.mixing == "given")
    if is_reference(cfg.topology):
        where = f"--topology {cfg.topology}"
        function = load_object(cfg.topology, "--topology")
        if not callable(function):
            raise UserError(f"{where} is {type(function).__name__}; it names a function(peers, round, seed)")
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
        cfg.topology_file = str(Path(cfg.topology_file).resolve())  # a resumed run reads the same file
    for name, reader in READ_ONLY_BY.items():
        if getattr(cfg, name) != GraphSpec.__dataclass_fields__[name].default and cfg.topology != reader:
            raise UserError(f"--{name.replace('_', '-')} applies to --topology {reader}, not {cfg.topology}")
    family = FAMILIES.get(cfg.topology)
    if family is not None and family.kappa is not None and "kappa" not in cfg.given:
        cfg.kappa = family.kappa


def check_topology(cfg, peers: int) -> None:
    """The graph against the algorithm and the mixing, before any data is read. A built-in family is
    checked by its settings (drawing 10^8 peers' graph to look at it would take the machine's memory);
    a user's graph, a function's or a file's, is drawn for the first round and checked where it enters."""
    schedule = schedule_of(cfg, peers)
    family = FAMILIES.get(cfg.topology)
    if family is not None and cfg.topology_file is None:
        directed = family.directed(graph_spec(cfg))
    else:
        directed = _refusing(schedule.graph, 0).is_directed()
    where = f"--topology-file {cfg.topology_file}" if cfg.topology_file else f"--topology {cfg.topology}"
    if directed:
        if not getattr(cfg.algorithm, "directed_graphs", False):
            raise UserError(
                f"{where} is directed (each peer hears its in-neighbours only); --algo {cfg.algo} needs symmetric "
                "exchanges. Directed graphs run dpsgd, dfedavg, dfedavgm and choco"
                + ("; or use --exponential-form symmetric" if cfg.topology == "exponential" else "")
            )
        if cfg.mixing == "metropolis":
            raise UserError(f"--mixing metropolis needs an undirected graph; {where} is directed (use uniform)")
    if cfg.mixing == "given" and family is not None and cfg.topology_file is None:
        raise UserError(f"--mixing given reads the weights on the edges of your own graph; {where}'s carry none")


def _refusing(function, *args):
    """function(*args), a GraphError as one UserError line."""
    try:
        return function(*args)
    except GraphError as exc:
        raise UserError(str(exc)) from None
