"""Graphs the user brings: a function's (peers, round, seed) -> networkx graph, or a file read with
networkx. What they return is checked where it enters, one line naming the function or file and what
is wrong, before any data is read (the first round's) and again each round they are drawn."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Callable

import networkx as nx

from topologies.families import Family, GraphError, GraphSpec

WEIGHT_SLACK = 1e-6  # how far a row of given weights may sum above 1 (decimal files round)
FILE_LIMIT = 64 << 20  # bytes: ~5 million edges; networkx holds a graph in ~25 times its file's size


def _read_edgelist(path: Path) -> nx.Graph:
    """'u v' or 'u v weight' per line; # starts a comment."""
    graph = nx.Graph()
    for number, line in enumerate(path.read_text().splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) not in (2, 3):
            raise GraphError(f"line {number} holds {len(words)} words; an edge list line reads 'u v' or 'u v weight'")
        if len(words) == 3:
            try:
                graph.add_edge(words[0], words[1], weight=float(words[2]))
            except ValueError:
                raise GraphError(f"line {number}: the weight {words[2]!r} is not a number") from None
        else:
            graph.add_edge(words[0], words[1])
    return graph


READERS: dict[str, Callable[[Path], nx.Graph]] = {
    ".txt": _read_edgelist,
    ".edges": _read_edgelist,
    ".edgelist": _read_edgelist,
    ".adjlist": lambda path: nx.read_adjlist(path),
    ".graphml": lambda path: nx.read_graphml(path),
    ".gml": lambda path: nx.read_gml(path, label=None),
}


def read_graph(path: Path) -> nx.Graph:
    """The graph in a file, by its suffix, with its labels read as peers (the label 3 or '3' is peer 3)."""
    where = f"--topology-file {path}"
    reader = READERS.get(path.suffix.lower())
    if reader is None:
        raise GraphError(f"{where}: reads {', '.join(READERS)} files (edge list, adjacency list, GraphML, GML)")
    if not path.is_file():
        raise GraphError(f"{where}: no such file")
    if path.stat().st_size > FILE_LIMIT:
        raise GraphError(
            f"{where}: {path.stat().st_size:,} bytes, more than the {FILE_LIMIT >> 20} MiB a graph file may hold "
            "(a graph that large is drawn faster by a function: --topology package.module:function)"
        )
    try:
        graph = reader(path)
    except GraphError as exc:
        raise GraphError(f"{where}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - networkx's parsers raise many kinds for a file that is not a graph
        raise GraphError(
            f"{where}: not a readable {path.suffix[1:]} graph ({type(exc).__name__}: {exc})"[:300]
        ) from None
    return nx.relabel_nodes(graph, {v: _peer(v) for v in graph.nodes})


def _peer(label):
    """A label that names a whole number is that peer; any other stays as it is (and is refused)."""
    if isinstance(label, str) and re.fullmatch(r"-?[0-9]+", label.strip()):
        return int(label)
    if isinstance(label, float) and label.is_integer():
        return int(label)
    return label


def check_graph_of(graph, n: int, where: str, weighted: bool = False, connected: bool = True) -> nx.Graph:
    """The user's graph as the run uses it, or one GraphError line naming where it came from; weighted:
    its edges' weights are checked as a mixing matrix's; connected: it must be connected by itself (else
    over a window of rounds: check_window)."""
    if not isinstance(graph, nx.Graph) or isinstance(graph, (nx.MultiGraph, nx.MultiDiGraph)):
        raise GraphError(f"{where} returned {type(graph).__name__}; a topology is a networkx Graph or DiGraph")
    peers = set(range(n))
    labels = set(graph.nodes)
    missing = sorted(peers - labels)
    extra = sorted(map(repr, labels - peers))
    if missing or extra:
        said = [f"missing {_some(missing)}" if missing else "", f"not peers: {_some(extra)}" if extra else ""]
        raise GraphError(
            f"{where}: node labels must be the run's peers 0..{n - 1} (node i is peer i); "
            + "; ".join(s for s in said if s)
        )
    loops = sorted(v for v, _ in nx.selfloop_edges(graph))
    if loops:
        raise GraphError(
            f"{where}: a self-loop at peer {loops[0]}; leave them out (a peer always keeps its own weights; "
            "with --mixing given, what it keeps is 1 minus its neighbours' weights)"
        )
    if n > 1 and connected:
        check_connected(graph, where)
    if weighted:
        check_given_weights(graph, where)
    check_link_attributes(graph, where)
    out = nx.DiGraph() if graph.is_directed() else nx.Graph()
    out.add_nodes_from(range(n))  # in peer order, as the built-in families
    out.add_edges_from(sorted(graph.edges(data=True), key=lambda e: (e[0], e[1])))
    return out


LINK_ATTRIBUTES = {"latency": "at least 0 (seconds)", "bandwidth": "above 0 (bytes per second)"}


def check_link_attributes(graph: nx.Graph, where: str) -> None:
    """The edges' latency and bandwidth (the virtual clock's, p2pfl.comm.clock): where one edge has one,
    every edge has it, a finite number, latency >= 0 and bandwidth > 0."""
    for name, wanted in LINK_ATTRIBUTES.items():
        given = [(u, v, d.get(name)) for u, v, d in graph.edges(data=True)]
        if all(value is None for *_, value in given):
            continue
        for u, v, value in given:
            if value is None:
                raise GraphError(f"{where}: edge {u}-{v} has no {name}, which other edges have; give every edge one")
            try:
                number = float(value)
            except (TypeError, ValueError):
                raise GraphError(f"{where}: edge {u}-{v}'s {name} {value!r} is not a number") from None
            low = 0.0 if name == "latency" else None
            if not math.isfinite(number) or (number < 0 if low is not None else number <= 0):
                raise GraphError(f"{where}: edge {u}-{v}'s {name} must be {wanted}, got {value}")


def check_connected(graph: nx.Graph, where: str) -> None:
    parts = list(nx.strongly_connected_components(graph) if graph.is_directed() else nx.connected_components(graph))
    if len(parts) > 1:
        sizes = sorted((len(p) for p in parts), reverse=True)
        raise GraphError(
            f"{where}: the graph is not {'strongly ' if graph.is_directed() else ''}connected ({len(parts)} parts "
            f"of {_some(sizes)} peers; peer {min(min(p) for p in parts[1:])} cannot reach everyone): averaging "
            "would never mix them"
        )


def check_given_weights(graph: nx.Graph, where: str) -> None:
    """--mixing given: every edge carries a weight >= 0 (edge u-v: what v puts on u, and u on v when
    undirected), and no peer's neighbour weights add up to more than 1 (it keeps the rest)."""
    if not graph.number_of_edges():
        raise GraphError(f"{where}: --mixing given reads the weights on the graph's edges, and it has none")
    row_sums = dict.fromkeys(graph.nodes, 0.0)
    for u, v, data in graph.edges(data=True):
        w = data.get("weight")
        if not isinstance(w, (int, float)) or isinstance(w, bool) or not math.isfinite(w):
            raise GraphError(f"{where}: --mixing given needs a numeric weight on every edge; {u}-{v} has {w!r}")
        if w < 0:
            raise GraphError(f"{where}: edge {u}-{v} has the negative weight {w:g}; mixing weights are >= 0")
        row_sums[v] += w
        if not graph.is_directed():
            row_sums[u] += w
    worst = max(row_sums, key=row_sums.get, default=None)
    if worst is not None and row_sums[worst] > 1 + WEIGHT_SLACK:
        raise GraphError(
            f"{where}: peer {worst}'s neighbour weights sum to {row_sums[worst]:.6g} > 1; each row of the mixing "
            "matrix sums to 1, the peer keeping 1 minus its neighbours' weights"
        )


def _some(items: list, shown: int = 8) -> str:
    return ", ".join(map(str, items[:shown])) + (f" ... ({len(items)} in all)" if len(items) > shown else "")


def function_family(function: Callable[[int, int, int], nx.Graph], where: str, weighted: bool = False) -> Family:
    """A family of the user's function(peers, round, seed) -> graph, checked each time it is called;
    weighted: its edges' weights are the mixing matrix (--mixing given). With spec.topology_window > 1 a
    graph need not be connected by itself: the schedule checks each window's union (TopologySchedule)."""

    def draw(n: int, round_index: int, spec: GraphSpec, seed: int) -> nx.Graph:
        said = f"{where} (round {round_index + 1})"
        return check_graph_of(function(n, round_index, seed), n, said, weighted, connected=spec.topology_window == 1)

    return Family(where, "your own function", draw, by_round=True)


def file_family(path: Path, weighted: bool = False) -> Family:
    """A static family of the graph in a file (read once)."""
    graph = read_graph(path)
    where = f"--topology-file {path}"

    def draw(n: int, round_index: int, spec: GraphSpec, seed: int) -> nx.Graph:
        return check_graph_of(graph, n, where, weighted)

    return Family(f"file {path.name}", f"the graph in {path}", draw, fixed=True)
