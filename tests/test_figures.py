"""Every figure a run or a tool draws, read back as a figure: counts get whole-number ticks, titles say
what is compared, one line style means one thing, the star's server is drawn as the hub, classes carry
their names. Figures are caught as they are saved (matplotlib's Figure.savefig)."""

import math

import matplotlib.figure
import networkx as nx
import pytest

from p2pfl.measure.figures import AGGREGATED, MEAN_CLIENT, OWN_MIX, plot_final_averaging, plot_metric, plot_partition
from p2pfl.tasks import TASKS
from tests.test_analysis import fake_run
from topologies.drawing import draw_graph, draw_views

COUNTS = (
    "round",
    "peer",
    "peers",
    "degree (neighbours)",
    "peers averaged (n)",
    "rounds",
    "distinct peers met",
    "samples",
)


@pytest.fixture
def saved(monkeypatch):
    figures = []
    real = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(
        matplotlib.figure.Figure,
        "savefig",
        lambda fig, *a, **k: (fig.canvas.draw(), figures.append(fig), real(fig, *a, **k))[-1],
    )
    return figures


def count_ticks(fig) -> list[float]:
    """The visible tick values of every axis labelled as a count (and every colorbar of samples)."""
    values = []
    for ax in fig.axes:
        for axis, label in ((ax.xaxis, ax.get_xlabel()), (ax.yaxis, ax.get_ylabel())):
            if label.split(" x ")[0] in COUNTS:
                low, high = sorted(axis.get_view_interval())
                values += [t for t in axis.get_ticklocs() if low - 1e-9 <= t <= high + 1e-9]
    return values


def whole(values) -> bool:
    return all(math.isclose(v, round(v), abs_tol=1e-9) for v in values)


@pytest.mark.parametrize("peers", [10, 300])
def test_a_runs_figures_count_in_whole_numbers(peers, saved, tmp_path):
    summary = [{"classes": [(p * 7 + c * 3) % 40 for c in range(10)]} for p in range(peers)]
    plot_partition(summary, tmp_path / "partition.png", tuple(f"name{c}" for c in range(10)))
    graph = nx.random_regular_graph(5, peers, seed=0)
    graph.graph["kind"] = "regular"
    draw_graph(graph, tmp_path / "topology.png")
    rows = [
        {"round": k, "test_acc": 0.5, "client_acc_mean": 0.4, "client_acc_min": 0.3, "client_acc_max": 0.6}
        for k in (1, 2, 3)
    ]
    plot_metric(rows, TASKS["classification"], tmp_path)
    accs = [0.5 + 0.01 * i for i in range(peers)]
    plot_final_averaging(
        {
            "n": list(range(1, peers + 1)),
            "client_val_acc": accs,
            "orders": {"high-to-low": {"test_acc": accs}},
            "selected": {"peers": 2, "test_acc": accs[1]},
        },
        tmp_path / "final.png",
    )
    draw_views(lambda k: nx.random_regular_graph(4, peers, seed=k), [0.1] * 3, tmp_path / "views", "views")
    assert len(saved) == 8
    for fig in saved:
        assert whole(count_ticks(fig)), [ax.get_title() for ax in fig.axes]
    drawn_as_nodes = peers <= 60
    assert sum(bool(count_ticks(fig)) for fig in saved) == 7 - drawn_as_nodes
    partition = saved[0].axes[0]
    assert [t.get_text() for t in partition.get_xticklabels()] == [f"name{c}" for c in range(10)]
    final = saved[3]
    assert len([ax for ax in final.axes if ax.get_lines() or ax.patches]) == 2  # curves and histogram apart


def test_the_star_draws_its_server_as_the_hub(saved, tmp_path):
    star = nx.star_graph(10)
    star.graph["kind"] = "star"
    draw_graph(star, tmp_path / "star.png")
    texts = [t.get_text() for t in saved[0].axes[0].texts]
    assert "server" in texts and "0" not in texts  # the hub is node 0 here, named for its role
    assert [t.get_text() for t in saved[0].axes[0].get_legend().get_texts()] == ["client", "server"]


def test_one_line_style_means_one_thing_in_every_figure(saved, tmp_path):
    from analysis.compare import compare

    rows = [
        {
            "round": k,
            "test_acc": 0.5,
            "client_acc_mean": 0.4,
            "client_acc_min": 0.3,
            "client_acc_max": 0.6,
            "client_personal_acc_mean": 0.7,
        }
        for k in (1, 2)
    ]
    plot_metric(rows, TASKS["classification"], tmp_path)
    runs = [fake_run(tmp_path / f"r{s}", "dfedavg", s, [0.5, 0.6]) for s in range(2)]
    compare(runs, out=tmp_path / "cmp.png")
    style = {}
    for fig in saved:
        for ax in fig.axes:
            for line in ax.get_lines():
                label = line.get_label()
                meaning = (
                    "aggregated"
                    if "aggregated" in label
                    else "own mix"
                    if "own label mix" in label
                    else "client"
                    if "mean client" in label
                    else None
                )
                if meaning:
                    style.setdefault(meaning, set()).add(line.get_linestyle())
    as_drawn = {"-": "-", ":": ":", "--": "--"}
    assert style == {
        "aggregated": {as_drawn[AGGREGATED]},
        "client": {as_drawn[MEAN_CLIENT]},
        "own mix": {as_drawn[OWN_MIX]},
    }


def test_compare_titles_say_what_is_compared_and_what_the_band_is(saved, tmp_path):
    from analysis.compare import compare

    one = [fake_run(tmp_path / "a", "dfedavg", 0, [0.5, 0.6]), fake_run(tmp_path / "b", "ntk-dfl", 0, [0.5, 0.7])]
    compare(one, out=tmp_path / "one.png")
    three = [fake_run(tmp_path / f"s{s}", "dfedavg", s, [0.5, 0.6]) for s in range(3)]
    compare(three, out=tmp_path / "three.png", band="std", title="my sweep")
    first, second = (fig._suptitle.get_text() for fig in saved)
    assert "by algo" in first and "peers 4" in first and "one run per group, no band" in first
    assert second.startswith("my sweep\n") and "+-1 std over 3 runs" in second and "algo dfedavg" in second
    assert count_ticks(saved[0]) and whole(count_ticks(saved[0]))


def test_a_sweeps_title_names_what_the_command_changed():
    from pathlib import Path

    from launch.sweep import sweep_title

    assert (
        sweep_title(Path("p/ntk-dfl-fmnist300.toml"), ["lr=0.1,0.2"], ["--peers", "10"])
        == "sweep of preset ntk-dfl-fmnist300 with --set lr=0.1,0.2 --peers 10"
    )
