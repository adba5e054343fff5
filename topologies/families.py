"""The graph families, one registered entry each: its name, the check that refuses impossible settings,
and the graph of a round. The CLI's choices, --help and the docs' table are read from FAMILIES.

Deterministic families (ring, chain, exponential, torus, hypercube, small-world's lattice) place the
peers by a seeded permutation, so a new seed gives new neighbours (as the NTK-DFL reference code's
dynamic ring) and a graph "new each round" is the same family relabelled."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import networkx as nx
import numpy as np

MAX_CONNECT_TRIES = 1000
MIN_CONNECTED_SHARE = 0.02  # an Erdos-Renyi draw must be connected this often, or the graph is refused
EXPONENTIAL_FORMS = ("directed", "symmetric")


class GraphError(ValueError):
    """A graph that cannot exist (or cannot be drawn connected), or a user's graph that is refused: the
    caller turns it into its own one-line refusal (p2pfl: a UserError)."""


@dataclass(frozen=True)
class GraphSpec:
    """What the families read besides the number of peers."""

    kappa: float = 5
    torus_sides: str = ""  # "RxC", or "" for the sides nearest a square
    rewire: float = 0.1  # small-world: each lattice edge's rewiring probability
    exponential_form: str = "directed"
    topology_window: int = 1  # a function's graphs: connected over each window of this many rounds, together


@dataclass(frozen=True)
class Family:
    """draw(n, round, spec, seed) -> the graph on peers 0..n-1; check(n, spec) raises GraphError before any
    work. by_round: the graph depends on the round itself (one-peer exponential), even in a static run."""

    name: str
    summary: str
    draw: Callable[[int, int, GraphSpec, int], nx.Graph]
    check: Callable[[int, GraphSpec], None] = lambda n, spec: None
    directed: Callable[[GraphSpec], bool] = lambda spec: False
    by_round: bool = False
    fixed: bool = False  # the same graph whatever the round and seed (a file's): drawn once
    placed_once: bool = False  # by_round on one placement of the peers for the whole run (the paper's), static or not
    period: Callable[[int], int] | None = None  # rounds after which a graph that changes by design repeats
    kappa: float | None = None  # its degree where --kappa is not given (None: --kappa's default or unused)
    reads: tuple[str, ...] = ()  # the GraphSpec fields it reads (any other given for it is a mistake)

    def graph(self, n: int, round_index: int, spec: GraphSpec, seed: int) -> nx.Graph:
        graph = self.draw(n, round_index, spec, seed)
        graph.graph["kind"] = self.name
        return graph


FAMILIES: dict[str, Family] = {}


def family(name: str, summary: str, **kwargs):
    """Register the decorated draw function as the family `name`."""

    def register(draw):
        FAMILIES[name] = Family(name, summary, draw, **kwargs)
        return draw

    return register


def build_graph(kind: str, n: int, kappa: float = 5, seed: int = 0, round_index: int = 0, **spec) -> nx.Graph:
    """One graph of a registered family on peers 0..n-1 (GraphError where it cannot exist); spec: the
    other GraphSpec fields (torus_sides, rewire, exponential_form)."""
    if kind not in FAMILIES:
        raise GraphError(f"unknown topology {kind!r}; choose one of: {', '.join(FAMILIES)}")
    settings = GraphSpec(kappa=kappa, **spec)
    FAMILIES[kind].check(n, settings)
    return FAMILIES[kind].graph(n, round_index, settings, seed)


def at_least_peers(least: int, what: str) -> Callable[[int, GraphSpec], None]:
    def check(n: int, spec: GraphSpec) -> None:
        if n < least:
            raise GraphError(f"a {what} needs at least {least} peers, got {n}")

    return check


def placed(n: int, edges, seed: int, directed: bool = False) -> nx.Graph:
    """The graph of positions 0..n-1 with the peers placed by a seeded permutation: position t is peer
    order[t]. Nodes are added in peer order, so every rank walks them alike."""
    order = np.random.default_rng(seed).permutation(n).tolist()
    graph = nx.DiGraph() if directed else nx.Graph()
    graph.add_nodes_from(range(n))
    graph.add_edges_from((order[a], order[b]) for a, b in edges)
    graph.graph["placement"] = order  # for drawings: a ring drawn around its positions, not as a tangle
    return graph


# -- random graphs --------------------------------------------------------------------------------------
def connected_share(n: int, kappa: float) -> float:
    """About how often G(n, p = kappa/(n-1)) is connected: exp(-expected isolated peers), the classic
    limit (isolated peers are what disconnects a sparse random graph)."""
    return math.exp(-n * (1 - kappa / (n - 1)) ** (n - 1))


def _check_regular(n: int, spec: GraphSpec) -> None:
    kappa = spec.kappa
    if kappa != int(kappa) or kappa < 1:
        raise GraphError(f"a kappa-regular graph needs a whole degree >= 1, got kappa={kappa}")
    if kappa >= n:
        raise GraphError(f"a {int(kappa)}-regular graph needs more than {int(kappa)} peers, got {n}")
    if (int(kappa) * n) % 2:
        raise GraphError(f"no {int(kappa)}-regular graph on {n} peers exists: kappa * peers must be even")


@family("regular", "random kappa-regular graph (--kappa: the degree)", check=_check_regular, reads=("kappa",))
def regular(n: int, round_index: int, spec: GraphSpec, seed: int) -> nx.Graph:
    rng = np.random.default_rng(seed)
    return nx.random_regular_graph(int(spec.kappa), n, seed=int(rng.integers(2**31)))


def _check_erdos_renyi(n: int, spec: GraphSpec) -> None:
    kappa = spec.kappa
    if not 0 < kappa <= n - 1:
        raise GraphError(f"an Erdos-Renyi mean degree must be in (0, peers-1] = (0, {n - 1}], got {kappa}")
    if connected_share(n, kappa) < MIN_CONNECTED_SHARE:
        least = math.log(n / -math.log(MIN_CONNECTED_SHARE))
        raise GraphError(
            f"an Erdos-Renyi graph of mean degree {kappa:g} on {n} peers is almost never connected "
            f"(about {100 * connected_share(n, kappa):.2g}% of draws); use kappa >= {least:.1f}"
        )


@family("erdos-renyi", "G(n, p) drawn connected (--kappa: the mean degree)", check=_check_erdos_renyi, reads=("kappa",))
def erdos_renyi(n: int, round_index: int, spec: GraphSpec, seed: int) -> nx.Graph:
    rng = np.random.default_rng(seed)
    p = spec.kappa / (n - 1)
    for _ in range(MAX_CONNECT_TRIES):  # redraw until connected, so averaging can mix everyone
        graph = nx.gnp_random_graph(n, p, seed=int(rng.integers(2**31)))
        if nx.is_connected(graph):
            return graph
    raise GraphError(
        f"no connected Erdos-Renyi graph of mean degree {spec.kappa:g} on {n} peers in "
        f"{MAX_CONNECT_TRIES} draws; use a larger kappa"
    )


def _check_small_world(n: int, spec: GraphSpec) -> None:
    k = spec.kappa
    if k != int(k) or k < 2 or int(k) % 2:
        raise GraphError(f"a small-world graph's lattice degree --kappa must be even and >= 2, got {k:g}")
    if k >= n:
        raise GraphError(f"a small-world graph of degree {int(k)} needs more than {int(k)} peers, got {n}")
    if not 0 <= spec.rewire <= 1:
        raise GraphError(f"--rewire is a probability in [0, 1], got {spec.rewire}")


@family(
    "small-world",
    "Watts-Strogatz: a ring lattice of degree --kappa, each edge rewired with probability --rewire, drawn connected",
    check=_check_small_world,
    kappa=4,
    reads=("kappa", "rewire"),
)
def small_world(n: int, round_index: int, spec: GraphSpec, seed: int) -> nx.Graph:
    rng = np.random.default_rng(seed)
    try:
        lattice = nx.connected_watts_strogatz_graph(
            n, int(spec.kappa), spec.rewire, tries=MAX_CONNECT_TRIES, seed=int(rng.integers(2**31))
        )
    except nx.NetworkXError:
        raise GraphError(
            f"no connected small-world graph of degree {int(spec.kappa)} and rewiring {spec.rewire:g} on {n} "
            f"peers in {MAX_CONNECT_TRIES} draws; use a larger --kappa or a smaller --rewire"
        ) from None
    return placed(n, lattice.edges, int(rng.integers(2**31)))


# -- deterministic graphs, peers placed by the seed --------------------------------------------------------
@family("ring", "a cycle through the peers in a seeded order", check=at_least_peers(3, "ring"))
def ring(n: int, round_index: int, spec: GraphSpec, seed: int) -> nx.Graph:
    return placed(n, zip(range(n), [*range(1, n), 0]), seed)


@family("chain", "a path through the peers in a seeded order", check=at_least_peers(2, "chain graph"))
def chain(n: int, round_index: int, spec: GraphSpec, seed: int) -> nx.Graph:
    return placed(n, zip(range(n - 1), range(1, n)), seed)


@family("star", "every peer linked to the hub, peer n-1 (a centralized run's server)", check=at_least_peers(2, "star"))
def star(n: int, round_index: int, spec: GraphSpec, seed: int) -> nx.Graph:
    return nx.relabel_nodes(nx.star_graph(n - 1), {i: (i - 1) % n for i in range(n)})


@family("full", "the complete graph", check=at_least_peers(2, "full graph"))
def full(n: int, round_index: int, spec: GraphSpec, seed: int) -> nx.Graph:
    return nx.complete_graph(n)


def exponents(n: int) -> int:
    """How many hops 2^0, 2^1, ... below n an exponential graph has: floor(log2(n - 1)) + 1."""
    return (n - 1).bit_length()


def _check_exponential(n: int, spec: GraphSpec) -> None:
    at_least_peers(2, "exponential graph")(n, spec)
    if spec.exponential_form not in EXPONENTIAL_FORMS:
        raise GraphError(
            f"--exponential-form must be one of {', '.join(EXPONENTIAL_FORMS)}, got {spec.exponential_form!r}"
        )


@family(
    "exponential",
    "peer i sends to i + 2^j (mod n), j = 0..floor(log2(n-1)) (Ying et al. 2021); directed, or its symmetric "
    "closure with --exponential-form symmetric",
    check=_check_exponential,
    directed=lambda spec: spec.exponential_form == "directed",
    reads=("exponential_form",),
)
def exponential(n: int, round_index: int, spec: GraphSpec, seed: int) -> nx.Graph:
    edges = [(i, (i + 2**j) % n) for i in range(n) for j in range(exponents(n))]
    graph = placed(n, edges, seed, directed=True)
    return graph if spec.exponential_form == "directed" else nx.Graph(graph)


@family(
    "one-peer-exponential",
    "round k: peer i sends to i + 2^(k mod ceil(log2 n)) only, W = (I + P)/2 (Ying et al. 2021); directed and "
    "time-varying",
    check=at_least_peers(2, "one-peer exponential graph"),
    directed=lambda spec: True,
    by_round=True,
    placed_once=True,  # a period of rounds averages exactly only on one placement (Ying et al. 2021)
    period=lambda n: max(1, math.ceil(math.log2(n))),
)
def one_peer_exponential(n: int, round_index: int, spec: GraphSpec, seed: int) -> nx.Graph:
    hop = 2 ** (round_index % max(1, math.ceil(math.log2(n))))
    return placed(n, [(i, (i + hop) % n) for i in range(n)], seed, directed=True)


def torus_sides(n: int, spec: GraphSpec) -> tuple[int, int]:
    """(rows, columns): --torus-sides RxC, or the factors of n nearest a square."""
    if spec.torus_sides:
        try:
            rows, columns = (int(s) for s in spec.torus_sides.lower().split("x"))
        except ValueError:
            raise GraphError(f"--torus-sides reads RxC, such as 4x8; got {spec.torus_sides!r}") from None
        if rows * columns != n:
            raise GraphError(f"--torus-sides {rows}x{columns} holds {rows * columns} peers, not the run's {n}")
    else:
        rows = max(r for r in range(1, math.isqrt(n) + 1) if n % r == 0)
        columns = n // rows
    if min(rows, columns) < 2:
        raise GraphError(
            f"a 2-D torus of {n} peers needs two sides of at least 2 ({n} has no such factors: use a ring)"
        )
    return rows, columns


@family(
    "torus",
    "2-D torus (periodic grid); its sides from --torus-sides, else the factors of n nearest a square",
    check=torus_sides,  # refuses sides that do not make n peers (what it returns is not needed here)
    reads=("torus_sides",),
)
def torus(n: int, round_index: int, spec: GraphSpec, seed: int) -> nx.Graph:
    rows, columns = torus_sides(n, spec)
    grid = nx.grid_2d_graph(rows, columns, periodic=True)
    graph = placed(n, ((a * columns + b, c * columns + d) for (a, b), (c, d) in grid.edges), seed)
    graph.graph["grid"] = (rows, columns)  # position t at row t // columns, column t % columns
    return graph


def _check_hypercube(n: int, spec: GraphSpec) -> None:
    if n < 2 or n & (n - 1):
        raise GraphError(f"a hypercube needs a power of 2 of peers, got {n}")


@family("hypercube", "peers linked where their positions differ in one bit (n a power of 2)", check=_check_hypercube)
def hypercube(n: int, round_index: int, spec: GraphSpec, seed: int) -> nx.Graph:
    bits = n.bit_length() - 1
    return placed(n, ((i, i ^ (1 << b)) for i in range(n) for b in range(bits) if i < i ^ (1 << b)), seed)
