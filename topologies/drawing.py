"""A round's graph as a PNG, so a run folder shows who talked to whom."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import networkx as nx  # noqa: E402


def draw_graph(graph: nx.Graph, path: Path, title: str = "") -> None:
    n = graph.number_of_nodes()
    kind = graph.graph.get("kind")
    if kind == "star":  # the hub (a centralized run's server) in the middle
        hub = max(graph.nodes, key=graph.degree)
        layout = nx.shell_layout(graph, [[hub], [v for v in graph.nodes if v != hub]])
    elif kind in ("ring", "regular", "full") or n > 60:
        layout = nx.circular_layout(graph)
    else:
        layout = nx.spring_layout(graph, seed=0)
    fig, ax = plt.subplots(figsize=(6, 6))
    size = max(8, 300 // max(1, n // 10))
    nx.draw_networkx_edges(graph, layout, ax=ax, alpha=0.35, width=0.6)
    nx.draw_networkx_nodes(graph, layout, ax=ax, node_size=size, node_color="tab:blue")
    if n <= 40:
        nx.draw_networkx_labels(graph, layout, ax=ax, font_size=7, font_color="white")
    ax.set_title(title or f"{graph.graph.get('kind', 'graph')}: {n} peers, {graph.number_of_edges()} edges")
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
