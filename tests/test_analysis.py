"""Comparing runs, sweeps, the NTK-DFL figures, topology views and the privacy study."""

import csv
import json
import subprocess
import sys

import matplotlib.image as mpimg
import pytest

from analysis.compare import compare
from p2pfl import testing
from tests.conftest import ROOT


def fake_run(folder, algo, seed, accs, bytes_per_round=100, wall=1.0, lr=0.1):
    """A run folder as p2pfl writes one: config.toml and metrics.jsonl."""
    folder.mkdir(parents=True)
    (folder / "config.toml").write_text(
        f'# model mlp\nalgo = "{algo}"\npeers = 4\nrounds = {len(accs)}\nseed = {seed}\nlr = {lr}\nprogress = false\n'
    )
    rows = [
        {"round": k + 1, "test_acc": a, "client_acc_mean": a - 0.1, "bytes_sent": bytes_per_round, "wall_s": wall}
        for k, a in enumerate(accs)
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_compare_groups_seeds_and_tabulates_targets(tmp_path):
    runs = [
        fake_run(tmp_path / f"a{s}", "ntk-dfl", s, acc, bytes_per_round=2**20)
        for s, acc in enumerate([[0.5, 0.7, 0.9], [0.6, 0.8, 0.85], [0.4, 0.6, 0.7]])
    ]
    runs += [fake_run(tmp_path / f"b{s}", "dfedavg", s, [0.3, 0.5, 0.6 + 0.01 * s]) for s in range(3)]
    rows = compare(runs, targets=[0.8], out=tmp_path / "out" / "cmp.png")
    a, b = rows
    assert (a["group"], a["runs"], b["group"]) == ("algo=ntk-dfl", 3, "algo=dfedavg")
    assert a["final_acc_mean"] == pytest.approx((0.9 + 0.85 + 0.7) / 3)
    assert (a["final_acc_min"], a["final_acc_max"]) == (0.7, 0.9)
    assert a["reached_0.8"] == "2/3" and a["rounds_to_0.8"] == pytest.approx(2.5)  # rounds 3 and 2
    assert a["mib_to_0.8"] == pytest.approx(2.5)  # 1 MiB a round
    assert b["reached_0.8"] == "0/3" and b["rounds_to_0.8"] is None
    image = mpimg.imread(tmp_path / "out" / "cmp.png")
    assert image.shape[1] > 2 * image.shape[0]  # three panels side by side: rounds, bytes, wall time
    table = (tmp_path / "out" / "cmp.md").read_text()
    assert "| algo=ntk-dfl | 3 | 81.67 |" in table
    with (tmp_path / "out" / "cmp.csv").open() as fh:
        assert [r["group"] for r in csv.DictReader(fh)] == ["algo=ntk-dfl", "algo=dfedavg"]


def test_compare_names_every_setting_the_groups_differ_in_and_mixed_groups(tmp_path, capsys, monkeypatch):
    """DFedAvg on 30 peers for 4 rounds beside NTK-DFL on 12 for 2: grouped by algo, yet peers, rounds and lr
    differ too, and the figure's note, the table and one line on stderr say so; a group whose own runs
    differ in more than their seed is named."""
    import analysis.compare as module

    def run(name, algo, seed, accs, peers, lr):
        folder = fake_run(tmp_path / name, algo, seed, accs, lr=lr)
        config = folder / "config.toml"
        config.write_text(config.read_text().replace("peers = 4", f"peers = {peers}"))
        return folder

    captions = []
    monkeypatch.setattr(module, "lay_out", lambda fig, handles, heading, caption, path: captions.append(caption))
    # DFedAvg off its own lr (0.1): flagged; NTK-DFL at its own (0.01) would not be alone
    runs = [run("a", "dfedavg", 0, [0.3, 0.5, 0.6, 0.7], 30, 0.05), run("b", "ntk-dfl", 0, [0.5, 0.8], 12, 0.01)]
    rows = compare(runs, out=tmp_path / "cmp.png")
    assert [r["group"] for r in rows] == ["algo=dfedavg", "algo=ntk-dfl"]
    assert (rows[0]["setting_peers"], rows[1]["setting_peers"], rows[1]["setting_rounds"]) == ("30", "12", "2")
    for text in (captions[-1], (tmp_path / "cmp.md").read_text(), capsys.readouterr().err):
        assert "peers (algo=dfedavg: 30, algo=ntk-dfl: 12)" in text and "rounds (" in text and "lr (" in text
    runs.append(run("c", "dfedavg", 1, [0.3, 0.6, 0.6, 0.7], 30, 0.5))  # the dfedavg group's lr now mixed
    compare(runs, by=["algo"], out=tmp_path / "by.png")
    assert "the runs of algo=dfedavg differ among themselves in lr" in capsys.readouterr().err


def test_compare_shows_which_p2pfl_wrote_each_group_and_flags_other_versions(tmp_path, capsys):
    runs = [fake_run(tmp_path / f"a{s}", "dfedavg", s, [0.5, 0.6]) for s in range(2)]
    runs.append(fake_run(tmp_path / "b", "ntk-dfl", 0, [0.5, 0.7]))
    for folder, version in zip(runs, ("0.2.0", "0.2.0", "0.1.0")):
        with (folder / "config.toml").open("a") as fh:
            fh.write(f'\n[p2pfl]\nversion = "{version}"\ncommit = "abcdef0123456789"\nmachine = "2-core x, no GPU"\n')
    rows = compare(runs, out=tmp_path / "cmp.png")
    assert [r["p2pfl"] for r in rows] == ["0.2.0 (abcdef01234)", "0.1.0 (abcdef01234)"]
    assert "the runs come from p2pfl versions 0.1.0, 0.2.0" in capsys.readouterr().err
    rows = compare(runs[:2], out=tmp_path / "same.png")  # one version: a column, no caveat
    assert rows[0]["p2pfl"] == "0.2.0 (abcdef01234)" and "versions" not in capsys.readouterr().err


@pytest.mark.subprocess
def test_compare_cli_by_setting_and_bad_input(tmp_path):
    for s in range(2):
        fake_run(tmp_path / "runs" / f"x{s}", "dfedavg", s, [0.2, 0.4], lr=0.5 if s else 0.1)
    cli = [sys.executable, "-m", "analysis", "compare", str(tmp_path / "runs"), "--out", str(tmp_path / "c.png")]
    split = subprocess.run(cli, capture_output=True, text=True, cwd=ROOT)
    assert split.returncode == 0, split.stderr
    assert "| lr=0.1 | 1 |" in split.stdout and "| lr=0.5 | 1 |" in split.stdout
    pooled = subprocess.run([*cli, "--by", "algo"], capture_output=True, text=True, cwd=ROOT)
    assert "| algo=dfedavg | 2 |" in pooled.stdout
    missing = subprocess.run([*cli[:4], str(tmp_path / "nothing")], capture_output=True, text=True, cwd=ROOT)
    assert missing.returncode != 0 and "not a run folder" in missing.stderr
    unknown = subprocess.run([*cli, "--by", "colour"], capture_output=True, text=True, cwd=ROOT)
    assert unknown.returncode != 0 and "--by colour" in unknown.stderr


@pytest.mark.subprocess
def test_sweep_runs_a_grid_over_seeds_then_skips_what_is_done(tmp_path):
    preset = tmp_path / "tiny.toml"
    preset.write_text('dataset = "synthetic"\npeers = 6\nkappa = 2\nrounds = 2\nlocal-epochs = 1\n')
    cmd = [
        sys.executable,
        "-m",
        "launch.sweep",
        str(preset),
        "--seeds",
        "0,1",
        "--set",
        "algo=dfedavg,dpsgd",
        "--out",
        str(tmp_path / "sweep"),
        "--target",
        "0.2",
    ]
    first = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout.count("done:") == 4
    for algo in ("dfedavg", "dpsgd"):
        for seed in range(2):
            config = (tmp_path / "sweep" / f"algo={algo}" / f"seed{seed}" / "config.toml").read_text()
            assert f'algo = "{algo}"' in config and f"seed = {seed}" in config
    assert "| algo=dfedavg" in first.stdout and (tmp_path / "sweep" / "compare.png").exists()
    again = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert again.returncode == 0 and "done:" not in again.stdout  # nothing run twice
    assert not list((tmp_path / "sweep").rglob("_check_"))
    typo = subprocess.run(
        [*cmd[:4], "--set", "kapa=3", "--out", str(tmp_path / "typo")], capture_output=True, text=True, cwd=ROOT
    )
    assert typo.returncode == 2 and "--kapa" in typo.stderr and not (tmp_path / "typo").exists()


@pytest.mark.slow
def test_figures_pipeline_draws_every_figure(tmp_path, monkeypatch, capsys):
    """launch.figures at a toy scale: every run, then every figure of the NTK-DFL paper's set. The runs in
    this process, one after the other (how the launch tools start runs, in their own interpreters, is
    test_sweep_runs_a_grid_over_seeds_then_skips_what_is_done's)."""
    import launch.figures

    def in_process(runs, jobs):
        return [
            testing.run_in_process([*r["argv"][r["argv"].index("p2pfl.run") + 1 :], "--overwrite"]).returncode
            for r in runs
        ]

    monkeypatch.setattr(launch.figures, "run_all", in_process)
    experiment = tmp_path / "toy.toml"
    experiment.write_text(
        '[common]\ndataset = "fashion-mnist"\npeers = 10\nsamples-per-peer = 20\nrounds = 2\n'
        "kappa = 4\nalpha = 0.1\ntest-samples = 300\nlocal-epochs = 1\n"
        "[compression]\npeers = 4\nsamples-per-peer = 8\nkappa = 2\n"
    )
    out = tmp_path / "figs"
    code = launch.figures.main([str(experiment), "--jobs", "2", "--out", str(out)])
    assert code == 0, capsys.readouterr().out[-3000:]
    expected = {
        "fig2_convergence": 3,
        "fig3_aggregated_vs_clients": 3,
        "fig4_topology_sparsity": 3,
        "fig5_final_averaging": 1,
        "fig6_per_round_averaging": 2,
        "fig7_variance": 1,
        "fig13_batching_subsampling": 1,
        "fig15_compression_bytes": 2,
    }
    least_aspect = {1: 1.2, 2: 2.0, 3: 2.5}  # width / height of one, two and three panels side by side
    # (fig13 is two by two)
    for name, panels in expected.items():
        height, width = mpimg.imread(out / "figures" / f"{name}.png").shape[:2]
        assert height > 300 and width / height >= least_aspect[panels], name
    captions = (out / "figures" / "captions.md").read_text()
    assert all(name in captions for name in expected) and "skipped" not in captions
    assert "alpha0.1/ntk-dfl" in captions  # each caption names its runs


@pytest.mark.subprocess
def test_topology_views_from_a_preset(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "analysis",
            "topology",
            "p2pfl/presets/ntk-dfl-fmnist300.toml",
            "--rounds",
            "8",
            "--peer",
            "3",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    for name in ("adjacency", "rounds", "statistics", "neighbourhood"):
        assert mpimg.imread(tmp_path / f"{name}.png").shape[0] > 200
    bad = subprocess.run(
        [sys.executable, "-m", "analysis", "topology", "p2pfl/presets/ntk-dfl-fmnist300.toml", "--peer", "300"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert bad.returncode == 2 and "--peer" in bad.stderr


@pytest.mark.slow  # NTK-DFL runs with and without compression and projection
def test_privacy_study_recovers_uncompressed_and_not_projected(tmp_path, monkeypatch):
    from analysis import privacy

    keep = ("factored message (default)", "dense, uncompressed", "projection 100")
    monkeypatch.setattr(privacy, "CONDITIONS", {k: privacy.CONDITIONS[k] for k in keep})
    rows = {r["condition"]: r for r in privacy.study(images=2, steps=120, out=tmp_path)}
    assert rows["factored message (default)"]["ssim_min"] > 0.999  # the raw inputs travel
    assert rows["dense, uncompressed"]["ssim_mean"] > 0.85
    assert rows["projection 100"]["ssim_mean"] < rows["dense, uncompressed"]["ssim_mean"] - 0.3
    assert (tmp_path / "privacy.png").exists() and "| projection 100 |" in (tmp_path / "privacy.md").read_text()


def test_compare_draws_a_line_at_each_target_on_every_panel(tmp_path, monkeypatch):
    import analysis.compare as module

    drawn = []
    monkeypatch.setattr(module, "lay_out", lambda fig, handles, heading, caption, path: drawn.append(fig))
    runs = [fake_run(tmp_path / f"a{s}", "ntk-dfl", s, [0.5, 0.7, 0.9]) for s in range(2)]
    compare(runs, targets=[0.8, 0.85], out=tmp_path / "cmp.png")
    for ax in drawn[0].axes:
        flat = {round(line.get_ydata()[0], 6) for line in ax.get_lines() if len(set(line.get_ydata())) == 1}
        assert {80.0, 85.0} <= flat


def test_compare_writes_beside_the_runs_by_default(tmp_path, monkeypatch):
    from analysis.compare import main as compare_main

    for s in range(2):
        fake_run(tmp_path / "sweep" / f"seed{s}", "dfedavg", s, [0.5, 0.7])
    monkeypatch.chdir(tmp_path / "sweep" / "seed0")  # not where the figure belongs
    assert compare_main([str(tmp_path / "sweep")]) == 0
    assert (tmp_path / "sweep" / "compare.png").exists() and (tmp_path / "sweep" / "compare.md").exists()
    assert not list((tmp_path / "sweep" / "seed0").glob("compar*"))


def test_the_tools_usage_examples_name_what_exists():
    """launch.table's example names a column its preset has; analysis's usage names forms its commands take."""
    import re
    import tomllib

    import analysis.__main__ as analysis_main
    import launch.table

    preset, column = re.search(r"launch\.table (\S+) .*--columns (\S+)\]", launch.table.__doc__).groups()
    from p2pfl import presets

    assert column in tomllib.loads(presets.find(preset, "experiment").read_text())["columns"]
    assert "--config" not in analysis_main.__doc__


def test_a_tables_plot_draws_the_metric_it_ranks_by_with_a_label_in_words(tmp_path, monkeypatch):
    import analysis.plots as plots

    drawn = {}

    def finish(fig, ax, path, xlabel, ylabel, title):
        drawn.update(ylabel=ylabel, ys=[list(line.get_ydata()) for line in ax.get_lines()])
        plots.plt.close(fig)

    monkeypatch.setattr(plots, "finish", finish)
    rows = [{"round": 1, "test_acc": 0.5, "client_personal_acc_mean": 0.9}]
    plots.plot_comparison({"dispfl": rows}, tmp_path / "c.png", key="client_personal_acc_mean")
    assert drawn["ys"] == [[90.0]]
    assert drawn["ylabel"] == "accuracy (%): each peer's own model on its personal test set"
    assert plots.metric_label("test_loss") == "loss (cross-entropy in nats): the aggregated model on the whole test set"


def test_a_tables_heat_map_writes_every_cell_in_percent_and_marks_a_run_that_did_not_finish(tmp_path, monkeypatch):
    import analysis.plots as plots

    drawn = {}
    monkeypatch.setattr(plots, "save", lambda fig, path: drawn.update(texts=[t.get_text() for t in fig.axes[0].texts]))
    cells = {"none": {"ring": 0.761, "exp": None}, "clipped-gossip": {"ring": 0.763, "exp": 0.729}}
    plots.plot_table(cells, tmp_path / "t.png", "test_acc")
    assert drawn["texts"] == ["76.1", "did not\nfinish", "76.3", "72.9"]


def test_topology_views_of_a_run_whose_graph_file_changed_are_refused(tmp_path, capsys):
    """They described the file as it is now, not the graph the run used."""
    from analysis import topology_views

    graph = tmp_path / "square.txt"
    graph.write_text("0 1\n1 2\n2 3\n3 0\n")
    args = ["--dataset", "synthetic", "--peers", "4", "--rounds", "1", "--no-progress"]
    assert (
        testing.run_in_process([*args, "--topology-file", str(graph), "--out", str(tmp_path / "run")]).returncode == 0
    )
    assert topology_views.main([str(tmp_path / "run"), "--rounds", "1"]) == 0
    graph.write_text("0 1\n1 2\n2 3\n3 0\n0 2\n")
    capsys.readouterr()
    assert topology_views.main([str(tmp_path / "run"), "--rounds", "1"]) == 2
    assert f"--topology-file {graph} changed since the run read it" in capsys.readouterr().err


def test_a_graph_is_inspected_without_a_run(tmp_path, capsys):
    """W, its spectral gap and the views from the run's own graph flags (BlueFog's users compute them
    before training); a time-varying family's rate over one period."""
    from analysis import topology_views

    args = ["--topology", "torus", "--peers", "16", "--rounds", "3", "--out", str(tmp_path / "t")]
    assert topology_views.graph_main(args) == 0
    assert "spectral gap of the metropolis mixing matrix over 3 rounds: 0.4\n" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == [
        "W.csv",
        "adjacency.png",
        "neighbourhood.png",
        "rounds.png",
        "statistics.png",
    ]
    import numpy as np

    w = np.loadtxt(tmp_path / "t" / "W.csv", delimiter=",")
    assert w.shape == (16, 16) and np.allclose(w.sum(0), 1) and np.allclose(w.sum(1), 1)
    args = ["--topology", "one-peer-exponential", "--peers", "16", "--algo", "sgp", "--rounds", "4"]
    args += ["--out", str(tmp_path / "e")]
    assert topology_views.graph_main(args) == 0
    assert "one period of 4 rounds mixes at a per-round rate of 1 " in capsys.readouterr().out
    assert topology_views.graph_main(["--peers", "16"]) == 2
    assert "name the graph: --topology NAME" in capsys.readouterr().err


def _six_groups(root):
    """A compression study's six groups (CHOCO-SGD with three codecs, D-PSGD on three graphs), 2 seeds each."""
    specs = [
        ("choco-topk", 'algo = "choco"\nchoco_gamma = 0.04\ngossip_topk = 0.01\n', 0.296),
        ("choco-q4", 'algo = "choco"\nchoco_gamma = 0.1\ngossip_quant_bits = 4\ngossip_topk = 0\n', 0.296),
        ("choco-q1", 'algo = "choco"\nchoco_gamma = 0.01\ngossip_quant_bits = 1\ngossip_topk = 0\n', 0.296),
        ("dpsgd-ring", 'algo = "dpsgd"\ntopology = "ring"\n', 0.02),
        ("dpsgd-torus", 'algo = "dpsgd"\ntopology = "torus"\n', 0.1),
        ("dpsgd-full", 'algo = "dpsgd"\ntopology = "full"\n', 1.0),
    ]
    folders = []
    for i, (name, config, gap) in enumerate(specs):
        for seed in range(2):
            folder = root / name / f"seed{seed}"
            folder.mkdir(parents=True)
            (folder / "config.toml").write_text(config + f"peers = 32\nrounds = 300\nseed = {seed}\n")
            rows = [
                {
                    "round": k + 1,
                    "test_acc": 0.1 + (0.8 - 0.05 * i) * (1 - 0.99**k) - 0.01 * seed,
                    "client_acc_mean": 0.1 + 0.7 * (1 - 0.99**k),
                    "bytes_sent": 1e6,
                    "round_s": 0.3,
                    "spectral_gap": gap,
                    "consensus_distance": (1 + i) / (k + 1),
                }
                for k in range(300)
            ]
            (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            folders.append(folder)
    return folders


def test_a_comparison_of_six_groups_reads_labels_fit_and_the_metric_meets_the_gap(tmp_path, monkeypatch):
    """The legend squeezed the panels, spilled into the next one and was cut off, and was drawn twice; no
    panel tied the metric to the spectral gap; the labels named settings at their algorithm's default."""
    import analysis.compare as module

    figures = []
    close = module.plt.close
    monkeypatch.setattr(module.plt, "close", lambda fig: figures.append(fig))
    rows = compare(_six_groups(tmp_path), out=tmp_path / "cmp.png")
    monkeypatch.setattr(module.plt, "close", close)
    assert [r["group"] for r in rows][3:] == [
        "algo=dpsgd, topology=ring",
        "algo=dpsgd, topology=torus",
        "algo=dpsgd, topology=full",
    ]
    assert "gossip_topk" not in rows[3]["group"] and rows[0]["final_consensus_distance"] == pytest.approx(1 / 300)
    table = (tmp_path / "cmp.md").read_text().splitlines()
    column = table[0].split(" | ").index("final_consensus_distance")
    assert table[2].split(" | ")[column] == f"{1 / 300:.4g}"  # not taken for an accuracy (it showed 0.33)
    (fig,) = figures
    renderer = fig.canvas.get_renderer()
    page = fig.bbox
    axes = fig.axes
    assert len(axes) == 4 and axes[3].get_xlabel() == "spectral gap (log scale)"
    assert len(fig.legends) == 1 and not any(ax.get_legend() for ax in axes)  # one legend, under the panels
    legend = fig.legends[0].get_window_extent(renderer)
    assert len(fig.legends[0].get_texts()) == 6 + 2
    assert page.x0 <= legend.x0 and legend.x1 <= page.x1 and page.y0 <= legend.y0
    assert not any(legend.overlaps(ax.get_window_extent(renderer)) for ax in axes)
    for ax in axes:
        box = ax.get_tightbbox(renderer)  # the panel with its tick labels and axis labels
        assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1
        assert not any(box.overlaps(other.get_window_extent(renderer)) for other in axes if other is not ax)
    close(fig)
    folders = _six_groups(tmp_path / "b")
    for folder in folders[6:8]:  # final.json's gap (a period's rate, where the graph changes by design) wins
        (folder / "final.json").write_text(json.dumps({"spectral_gap": 0.5}))
    again = compare(folders, out=tmp_path / "b.png", labels="folder", y="consensus_distance")
    names = ["choco-topk", "choco-q4", "choco-q1", "dpsgd-ring", "dpsgd-torus", "dpsgd-full"]
    assert [r["group"] for r in again] == names and [r["spectral_gap"] for r in again][3:] == [0.5, 0.1, 1.0]
    monkeypatch.setattr(module.plt, "close", lambda fig: figures.append(fig))
    compare(folders[:6], out=tmp_path / "one-gap.png")  # three codecs on one graph: no gap axis to spread on
    monkeypatch.setattr(module.plt, "close", close)
    assert len(figures[-1].axes) == 3
    close(figures[-1])


def test_like_with_like_spares_each_algorithms_own_training_defaults(tmp_path, capsys):
    """NTK-DFL against DFedAvg, each at its own defaults (the reproduce page's headline), was flagged for
    batch size, local epochs and lr; a run-level difference, or an lr off its algorithm's default, is."""
    from analysis.compare import setting_defaults

    runs = []
    for algo, peers in (("ntk-dfl", 12), ("dfedavg", 12)):
        own = setting_defaults(algo)
        folder = fake_run(tmp_path / algo, algo, 0, [0.5, 0.7], lr=own["lr"])
        with (folder / "config.toml").open("a") as fh:
            fh.write("".join(f"{k} = {own[k]}\n" for k in ("batch_size", "local_epochs") if own.get(k) is not None))
        runs.append(folder)
    compare(runs, out=tmp_path / "fair.png")
    assert "not like with like" not in capsys.readouterr().err
    config = runs[1] / "config.toml"
    config.write_text(config.read_text().replace("peers = 4", "peers = 30"))
    compare(runs, out=tmp_path / "unfair.png")
    err = capsys.readouterr().err
    assert "not like with like: the groups also differ in peers" in err and "lr" not in err


def test_runs_at_a_time_share_the_cores_between_their_thread_pools(tmp_path, monkeypatch):
    """Two runs at a time on two cores, each with a pool of two, spun against each other (4.8 s a D-PSGD
    round where one thread each takes 0.1 s): each run started by the launch tools gets cores / (jobs x
    ranks) threads, unless the environment says otherwise."""
    import launch.table

    seen = []
    monkeypatch.setattr(launch.table.os, "cpu_count", lambda: 8)
    monkeypatch.setattr(
        launch.table.subprocess, "run", lambda argv, **kw: seen.append(kw["env"]["OMP_NUM_THREADS"]) or Done()
    )

    class Done:
        returncode = 0

    def plan(ranks):
        prefix = ["mpirun", "-n", str(ranks)] if ranks > 1 else []
        return [
            {"folder": tmp_path / f"r{ranks}-{i}", "argv": [*prefix, "python", "-m", "p2pfl.run"], "state": "new"}
            for i in range(2)
        ]

    from p2pfl.threads import POOLS

    for var in POOLS:
        monkeypatch.delenv(var, raising=False)
    assert launch.table.run_all(plan(1), jobs=2) == [0, 0] and seen == ["4", "4"]
    seen.clear()
    launch.table.run_all(plan(3), jobs=2)
    assert seen == ["1", "1"]  # 8 cores // (2 jobs x 3 ranks)
    seen.clear()
    launch.table.run_all(plan(1), jobs=1)
    assert seen == ["8", "8"]
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    seen.clear()
    launch.table.run_all(plan(1), jobs=2)
    assert seen == ["3", "3"]  # the user's own setting stands


def test_tradeoff_plots_each_series_mean_over_the_columns_and_refuses_an_empty_one(tmp_path, capsys):
    from analysis.tradeoff import main, series_points

    cell = lambda acc, eps: {"test_acc": acc, "dp_epsilon": eps, "dp_epsilon_network": eps / 2}  # noqa: E731
    results = {
        "seed0": {"noise-1": cell(0.6, 20.0), "noise-4": cell(0.5, 4.0), "muffliato-1": cell(0.7, 10.0)},
        "seed1": {"noise-1": cell(0.8, 22.0), "noise-4": cell(0.7, 4.0), "muffliato-1": cell(0.7, 12.0)},
    }
    points = series_points(results, "noise-*", "dp_epsilon", "test_acc")
    assert [p[:2] for p in points] == [pytest.approx((4.0, 0.6)), pytest.approx((21.0, 0.7))]  # sorted by x
    assert points[1][3] == pytest.approx(0.1414, rel=1e-3)  # the spread over the columns
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    series = ["--series", "local=noise-*:dp_epsilon", "--series", "M=muffliato-*:dp_epsilon_network"]
    assert main([str(path), *series]) == 0
    assert mpimg.imread(tmp_path / "tradeoff.png").shape[0] > 100
    assert "M: (5.5, 0.7)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([str(path), "--series", "none=nothing-*:dp_epsilon"])
    assert "no method matching 'nothing-*'" in capsys.readouterr().err


def test_a_tables_target_is_the_first_evaluated_round_that_reaches_it_and_its_virtual_seconds(tmp_path):
    from launch.table import reaching

    rows = [
        {"round": 20, "test_acc": 0.61, "sim_time_s": 6.6, "test_loss": 0.9},
        {"round": 30, "test_acc": 0.68},  # not evaluated for the clock: it counts all the same
        {"round": 40, "test_acc": 0.72, "sim_time_s": 13.2, "test_loss": 0.5},
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    assert reaching(tmp_path, "test_acc", 0.7) == {"rounds_to_target": 40, "sim_time_s_to_target": 13.2}
    assert reaching(tmp_path, "test_loss", 0.6) == {"rounds_to_target": 40, "sim_time_s_to_target": 13.2}
    assert reaching(tmp_path, "test_acc", 0.8) == {"rounds_to_target": None, "sim_time_s_to_target": None}
