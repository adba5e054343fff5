"""Pictures of the peer graph. Small graphs are drawn as nodes and edges; at the papers' scale (300
peers) a drawing is a hairball, so the views there are matrices, rasters and histograms."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import networkx as nx
import numpy as np

DRAWN_UP_TO = 60  # peers; larger graphs get the adjacency view in a run folder


def _pyplot():
    """pyplot on the file-only backend, loaded at the first drawing (a run without figures needs none)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def draw_graph(graph: nx.Graph, path: Path, title: str = "") -> None:
    """A run folder's topology.png: nodes and edges up to DRAWN_UP_TO peers (and any star), else the
    adjacency matrix (ordered by placement where a family placed the peers) beside the degree histogram."""
    n = graph.number_of_nodes()
    kind = graph.graph.get("kind")
    title = title or f"{kind or 'graph'}: {n} peers, {graph.number_of_edges()} edges"
    if n > DRAWN_UP_TO and kind != "star":
        fig, (left, right) = _pyplot().subplots(1, 2, figsize=(11, 5), gridspec_kw={"width_ratios": [1.2, 1]})
        adjacency_panel(left, graph, f"adjacency, ordered by {'placement' if 'placement' in graph.graph else 'peer'}")
        degree_panel(right, [graph])
        fig.suptitle(title)
        _save(fig, path)
        return
    hub = max(graph.nodes, key=graph.degree) if kind == "star" else None
    if hub is not None:  # the hub (a centralized run's server) in the middle
        layout = nx.shell_layout(graph, [[hub], [v for v in graph.nodes if v != hub]])
    elif "grid" in graph.graph:  # a torus on its grid, each peer at its position
        columns = graph.graph["grid"][1]
        layout = {
            peer: np.array([t % columns, -(t // columns)], float) for t, peer in enumerate(graph.graph["placement"])
        }
    elif "placement" in graph.graph:  # a ring, an exponential graph, a hypercube: its positions around a circle
        order = graph.graph["placement"]
        layout = {
            peer: np.array([np.cos(2 * np.pi * t / n), np.sin(2 * np.pi * t / n)]) for t, peer in enumerate(order)
        }
    elif kind in ("ring", "regular", "full") or n > DRAWN_UP_TO:
        layout = nx.circular_layout(graph)
    else:
        layout = nx.spring_layout(graph, seed=0)
    fig, ax = _pyplot().subplots(figsize=(6, 6))
    size = max(8, 300 // max(1, n // 10))
    weights = [w for _, _, w in graph.edges(data="weight")]
    given = weights and all(isinstance(w, (int, float)) and not isinstance(w, bool) for w in weights)
    widths = [0.6 + 6 * w for w in weights] if given else 0.6  # --mixing given: each edge as thick as its weight
    nx.draw_networkx_edges(graph, layout, ax=ax, alpha=0.35, width=widths)
    peers = [v for v in graph.nodes if v != hub]
    nx.draw_networkx_nodes(
        graph,
        layout,
        nodelist=peers,
        ax=ax,
        node_size=size,
        node_color="tab:blue",
        label="client" if hub is not None else None,
    )
    if n <= 40:
        nx.draw_networkx_labels(graph, layout, {v: str(v) for v in peers}, ax=ax, font_size=7, font_color="white")
    if hub is not None:
        nx.draw_networkx_nodes(
            graph, layout, nodelist=[hub], ax=ax, node_size=1200, node_color="tab:red", node_shape="s", label="server"
        )
        nx.draw_networkx_labels(graph, layout, {hub: "server"}, ax=ax, font_size=8, font_color="white")
        ax.legend(loc="upper left", fontsize=8, markerscale=0.5)
    ax.set_title(title)
    ax.axis("off")
    _save(fig, path)


def adjacency_panel(ax, graph: nx.Graph, title: str) -> None:
    """The adjacency matrix, a built-in family's ordered by placement (a ring's a band along the diagonal,
    not dots scattered by the peers' seeded labels), a user's by peer."""
    n = graph.number_of_nodes()
    order = graph.graph.get("placement", range(n))
    ax.spy(nx.to_numpy_array(graph, nodelist=order), markersize=max(1.0, min(4.0, 400 / n)), color="black")
    ax.xaxis.set_ticks_position("bottom")
    axis = "position" if "placement" in graph.graph else "peer"
    ax.set(title=title, xlabel=axis, ylabel=axis)


def degree_panel(ax, graphs: list[nx.Graph]) -> None:
    degrees = [d for g in graphs for _, d in g.degree]
    low, high = min(degrees), max(degrees)
    ax.hist(degrees, bins=np.arange(low, high + 2) - 0.5, rwidth=0.85, color="tab:blue", alpha=0.8)
    ax.set_xlim(low - 1, high + 1)  # a regular graph's one degree stands as one bar among whole numbers
    whole_numbers(ax.xaxis, ax.yaxis)
    ax.set(
        xlabel="degree (neighbours)",
        ylabel="peers" + (f" x {len(graphs)} rounds" if len(graphs) > 1 else ""),
        title=f"degrees: mean {np.mean(degrees):.2f}, min {min(degrees)}, max {max(degrees)}",
    )


def draw_rounds(graphs: list[nx.Graph], path: Path, title: str) -> None:
    """Small multiples: the adjacency matrix of each of the first rounds."""
    fig, axes = _pyplot().subplots(1, len(graphs), figsize=(3.2 * len(graphs), 3.6), squeeze=False)
    for k, (ax, graph) in enumerate(zip(axes[0], graphs)):
        adjacency_panel(ax, graph, f"round {k + 1}")
        ax.set(xlabel="", ylabel="")
    fig.suptitle(title)
    _save(fig, path)


def draw_statistics(graphs: list[nx.Graph], gaps: list[float], path: Path, title: str) -> None:
    """Degree histogram over all rounds, and the histogram of the rounds' spectral gaps."""
    fig, (left, right) = _pyplot().subplots(1, 2, figsize=(11, 4.2))
    degree_panel(left, graphs)
    right.hist(gaps, bins=min(30, max(5, len(gaps) // 2)), color="tab:green", alpha=0.8)
    whole_numbers(right.yaxis)
    right.set(
        xlabel="spectral gap 1 - |lambda_2| of the round's mixing matrix",
        ylabel="rounds",
        title=f"spectral gap over {len(gaps)} rounds: mean {np.mean(gaps):.3f}, min {min(gaps):.3f}",
    )
    fig.suptitle(title)
    _save(fig, path)


def draw_neighbourhood(graphs: list[nx.Graph], peer: int, path: Path, title: str) -> None:
    """One peer's neighbours in each round (a raster: rounds by peers), and how many distinct peers it
    has met so far."""
    n = graphs[0].number_of_nodes()
    raster = np.zeros((len(graphs), n))
    for k, graph in enumerate(graphs):
        raster[k, list(graph.neighbors(peer))] = 1
    met = np.cumsum(raster, 0) > 0
    fig, (left, right) = _pyplot().subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [2, 1]})
    left.imshow(
        raster, aspect="auto", cmap="Greys", interpolation="nearest", extent=(-0.5, n - 0.5, len(graphs) + 0.5, 0.5)
    )
    left.axvline(peer, color="tab:red", lw=0.8)
    left.set(xlabel="peer", ylabel="round", title=f"neighbours of peer {peer} (red line: the peer)")
    right.plot(range(1, len(graphs) + 1), met.sum(1), "o-", ms=3)
    whole_numbers(left.yaxis, right.xaxis, right.yaxis)
    right.set(xlabel="round", ylabel="distinct peers met", title="peers met so far")
    right.grid(alpha=0.3)
    fig.suptitle(title)
    _save(fig, path)


def draw_views(
    graph_of: Callable[[int], nx.Graph],
    gaps: list[float],
    out: Path,
    title: str,
    peer: int = 0,
    multiples: int = 6,
) -> list[Path]:
    """Every view of a run's topology over its rounds into out/: adjacency.png, rounds.png,
    statistics.png, neighbourhood.png; gaps: each round's spectral gap, one a round drawn."""
    out.mkdir(parents=True, exist_ok=True)
    graphs = [graph_of(k) for k in range(len(gaps))]
    paths = [out / name for name in ("adjacency.png", "rounds.png", "statistics.png", "neighbourhood.png")]
    fig, ax = _pyplot().subplots(figsize=(6.5, 6))
    adjacency_panel(ax, graphs[0], f"{title}: round 1")
    _save(fig, paths[0])
    draw_rounds(graphs[:multiples], paths[1], title)
    draw_statistics(graphs, gaps, paths[2], title)
    draw_neighbourhood(graphs, peer, paths[3], title)
    return paths


def whole_numbers(*axes) -> None:
    """Integer ticks on axes that count something (rounds, peers, degrees, classes, runs)."""
    from matplotlib.ticker import MaxNLocator

    for axis in axes:
        axis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
