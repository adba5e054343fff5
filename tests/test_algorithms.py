import pytest
import torch

from p2pfl.algorithms.base import neighbour_average
from p2pfl.run import main
from p2pfl.local.gradients import gradients
from p2pfl.local.training import sample_batch
from tests.helpers import make_context, metric_lines
from topologies import mixing_weights

KEYS = {
    "round",
    "test_acc",
    "test_loss",
    "client_acc_mean",
    "client_acc_se",  # each client on its own subset by default: the mean's precision, no min or max
    "variance",
    "bytes_sent",
    "train_s",
    "eval_s",
    "round_s",
}


def test_full_graph_uniform_average_is_the_global_mean():
    ctx, _ = make_context(topology="full", init="different")
    out = neighbour_average(ctx, 0, ctx.flat)
    assert torch.allclose(out, ctx.flat.mean(0, keepdim=True).expand_as(out), atol=1e-6)
    sent, _, _ = ctx.transport.counter.take()
    assert sent["average"] == 8 * 7 * ctx.flat.shape[1] * 4  # every peer sends its weights to 7 others


def test_dpsgd_round_is_mix_then_local_gradient_step():
    ctx, algo = make_context(algo="dpsgd", mixing="metropolis", topology="erdos-renyi", init="different")
    before = ctx.flat.clone()
    index, mask = sample_batch(ctx.local_shards, ctx.cfg.batch_size, ctx.cfg.seed, 0, ctx.peers)
    grad, _ = gradients(ctx.stack, before, ctx.data.train_x[index], ctx.data.train_y[index], mask)
    W = mixing_weights(ctx.schedule.graph(0), "metropolis")
    expected = torch.stack([sum(w * before[j] for j, w in W[i]) - ctx.cfg.lr * grad[i] for i in range(8)])
    algo.round(0)
    assert torch.allclose(ctx.flat, expected, atol=1e-5)


def test_dfedavg_trains_then_averages():
    ctx, algo = make_context(algo="dfedavg", local_epochs=1)
    start = ctx.flat.clone()
    algo.round(0)
    assert not torch.allclose(ctx.flat, start)
    # after averaging on a 3-regular graph, each peer's model is a mean of 4 trained models
    assert ctx.flat.shape == start.shape and torch.isfinite(ctx.flat).all()


def test_run_folder_contents(tmp_path):
    out = tmp_path / "run"
    assert (
        main(
            [
                "--dataset",
                "synthetic",
                "--peers",
                "10",
                "--rounds",
                "3",
                "--out",
                str(out),
                "--no-progress",
                "--local-epochs",
                "2",
            ]
        )
        == 0
    )
    rows = [r for r in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3
    import json

    last = json.loads(rows[-1])
    assert KEYS <= set(last) and last["round"] == 3 and last["bytes_sent"] > 0
    assert last["test_acc"] > 0.3  # synthetic clusters: well above 10% chance after 3 rounds
    for name in ("accuracy.png", "topology.png", "partition.png", "config.toml", "partition.json", "model.pt"):
        assert (out / name).stat().st_size > 0, name
    assert 'algo = "dfedavg"' in (out / "config.toml").read_text()
    assert "lr = 0.1" in (out / "config.toml").read_text()  # resolved algorithm default


def test_config_file_and_flag_override(tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text('dataset = "synthetic"\npeers = 6\nrounds = 5\nkappa = 2\nlocal-epochs = 1\n')
    out = tmp_path / "run"
    assert main(["--config", str(cfg), "--rounds", "1", "--out", str(out), "--no-progress"]) == 0
    assert len(metric_lines(out)) == 1
    text = (out / "config.toml").read_text()
    assert "peers = 6" in text and "rounds = 1" in text


def test_same_seed_same_metrics(tmp_path):
    args = [
        "--dataset",
        "synthetic",
        "--peers",
        "8",
        "--kappa",
        "3",
        "--rounds",
        "2",
        "--local-epochs",
        "1",
        "--no-progress",
    ]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "--out", str(tmp_path / "b")]) == 0
    assert main([*args, "--out", str(tmp_path / "c"), "--seed", "1"]) == 0
    assert metric_lines(tmp_path / "a") == metric_lines(tmp_path / "b")
    assert metric_lines(tmp_path / "a") != metric_lines(tmp_path / "c")


def test_divergence_stops_with_round_and_peers(tmp_path, capsys):
    code = main(
        [
            "--dataset",
            "synthetic",
            "--peers",
            "6",
            "--kappa",
            "2",
            "--rounds",
            "3",
            "--lr",
            "1e30",
            "--local-epochs",
            "1",
            "--out",
            str(tmp_path / "r"),
            "--no-progress",
        ]
    )
    err = capsys.readouterr().err
    assert code == 3 and "round 1:" in err and "NaN/inf" in err  # rounds count from 1, as in metrics.jsonl


def test_every_preset_is_a_valid_config():
    from pathlib import Path

    from p2pfl.runner.configure import load_toml, make_config

    presets = sorted(Path(__file__).resolve().parents[1].glob("p2pfl/presets/*.toml"))
    assert presets
    for path in presets:
        make_config(load_toml(str(path)))


def test_every_run_of_every_experiment_parses(tmp_path):
    """The experiments feed launch.table, launch.fedavg_ft or launch.figures: every run they would start must
    be a valid command line (data files are not needed to parse) of the algorithm its method names."""
    import tomllib

    from launch.experiment import experiment_runs
    from p2pfl import presets
    from p2pfl.runner.configure import parse_config

    experiments = sorted(presets.EXPERIMENTS.glob("*.toml"))
    assert len(experiments) >= 13
    for path in experiments:
        preset = tomllib.loads(path.read_text())
        runs = experiment_runs(path, tmp_path)
        assert len(runs) >= 2, path
        for run in runs:
            cfg = parse_config(run["argv"][3:])
            named = preset.get(run.get("method"), {}).get("algo", cfg.algo)
            assert cfg.algo == named, path


def test_ntk_dfl_run_folder_and_phases(tmp_path):
    import json

    out = tmp_path / "ntk"
    assert (
        main(
            [
                "--algo",
                "ntk-dfl",
                "--dataset",
                "synthetic",
                "--peers",
                "8",
                "--kappa",
                "3",
                "--rounds",
                "2",
                "--ntk-taus",
                "20,50",
                "--out",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    )
    rows = metric_lines(out)
    assert set(rows[0]["bytes_by_phase"]) == {"average", "weights", "jacobians"}
    assert rows[0]["bytes_dense"] > 20 * rows[0]["bytes_sent"]  # factors are far smaller than dense Jacobians
    final = json.loads((out / "final.json").read_text())
    assert set(final["orders"]) == {"high-to-low", "random", "low-to-high"}
    assert final["n"][-1] == 8 and (out / "final_averaging.png").stat().st_size > 0
    high = final["orders"]["high-to-low"]["val_acc"]
    assert high[0] == max(final["client_val_acc"])  # the first of high-to-low is the best peer
    assert "tau_histogram" in final


@pytest.mark.slow  # long by design (every NTK-DFL option, a run each)
def test_ntk_dfl_options_run(tmp_path):
    """Ablation and communication options: no averaging, batching m1, subsampling m2, compression."""
    base = [
        "--algo",
        "ntk-dfl",
        "--dataset",
        "synthetic",
        "--peers",
        "6",
        "--kappa",
        "2",
        "--rounds",
        "1",
        "--ntk-taus",
        "10",
        "--no-progress",
    ]
    variants = {
        "noavg": ["--ntk-no-avg"],
        "m1": ["--ntk-batches", "2"],
        "m2": ["--ntk-subsample", "4"],
        "compress": ["--ntk-topk", "0.5", "--ntk-quant-bits", "6", "--hidden", "16"],  # dense Jacobians: 23 s at 100
        "proj": ["--ntk-projection", "16"],
        "mse": ["--ntk-loss", "mse", "--ntk-selection", "linearized"],
        "own": ["--ntk-selection", "own"],
    }
    sent = {}
    for name, extra in variants.items():
        assert main([*base, *extra, "--out", str(tmp_path / name)]) == 0, name
        sent[name] = metric_lines(tmp_path / name)[0]["bytes_by_phase"]
    assert "average" not in sent["noavg"]
    assert sent["m2"]["jacobians"] < sent["mse"]["jacobians"] / 3
    assert sent["m1"]["weights"] == 2 * sent["mse"]["weights"]


def test_compression_needs_dense_path(capsys):
    assert main(["--algo", "ntk-dfl", "--ntk-jacobian", "factored", "--ntk-topk", "0.5"]) == 2
    assert "dense" in capsys.readouterr().err


def test_ntk_dfl_reuses_inputs_grams_with_the_same_results(monkeypatch):
    """Each peer's inputs Gram is kept across neighbourhoods and rounds while its samples stay the same
    (and replaced when they change, with subsampling): the weights equal those of a run keeping none."""
    import p2pfl.ntk.inputs_cache as inputs_cache

    def run(**extra):
        ctx, algo = make_context(algo="ntk-dfl", peers=8, kappa=3, ntk_taus=(20, 50), **extra)
        for r in range(3):
            algo.round(r)
        return ctx.flat.clone(), algo.inputs.kept

    for extra in ({}, {"ntk_subsample": 2}, {"ntk_batches": 2}):
        kept, grams = run(**extra)
        assert len(grams) == 8 * extra.get("ntk_batches", 1)  # every peer's, for this round's samples
        monkeypatch.setattr(inputs_cache, "INPUTS_CACHE_BYTES", 0)
        fresh, none = run(**extra)
        monkeypatch.undo()
        assert not none and torch.equal(kept, fresh), extra


def test_final_averaging_evaluates_on_the_test_samples_asked_for(tmp_path):
    """--test-samples bounds every evaluation, final averaging's validation and test halves included."""
    import json

    out = tmp_path / "few"
    assert (
        main(
            [
                "--algo",
                "ntk-dfl",
                "--dataset",
                "synthetic",
                "--peers",
                "8",
                "--kappa",
                "3",
                "--rounds",
                "1",
                "--ntk-taus",
                "20",
                "--test-samples",
                "101",
                "--out",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    )
    final = json.loads((out / "final.json").read_text())
    assert (final["val_samples"], final["test_samples"]) == (50, 51)
    assert all(abs(a * 50 - round(a * 50)) < 1e-4 for a in final["client_val_acc"])  # counts out of 50


def test_the_gpu_preset_is_the_papers_run_on_cuda():
    """ntk-dfl-fmnist300-gpu.toml differs from the paper's preset only in where it runs and for how long."""
    from pathlib import Path

    from p2pfl.runner.configure import load_toml

    presets = Path(__file__).resolve().parents[1] / "p2pfl/presets"
    cpu, gpu = (load_toml(str(presets / name)) for name in ("ntk-dfl-fmnist300.toml", "ntk-dfl-fmnist300-gpu.toml"))
    assert gpu.pop("device") == "cuda" and gpu.pop("rounds") == 40
    cpu.pop("rounds")
    assert gpu == cpu


def test_mixing_rows_together_is_adding_edge_by_edge_bit_for_bit(monkeypatch):
    """neighbour_average mixes every row's k-th neighbour at once (a few launches per neighbour on a GPU,
    not one per edge): the same sums, in the same order, as adding w * x edge by edge from zero."""
    import random

    from p2pfl.algorithms import base
    from p2pfl.algorithms.base import mix_rows

    rng = random.Random(0)
    for trial in range(20):
        rows, width = rng.randint(1, 12), rng.randint(1, 300)
        flat = torch.randn(rows, width, generator=torch.Generator().manual_seed(trial)) * 10 ** rng.uniform(-3, 3)
        terms = []
        for _ in range(rows):
            k = rng.randint(1, 7)
            w = [rng.random() for _ in range(k)]
            w = [1.0 / k] * k if rng.random() < 0.5 else [v / sum(w) for v in w]
            terms.append([(v, torch.randn(width) if rng.random() < 0.5 else flat[rng.randrange(rows)]) for v in w])
        edge_by_edge = torch.empty_like(flat)
        for i, row in enumerate(terms):
            acc = torch.zeros_like(flat[0])
            for v, x in row:
                acc += v * x
            edge_by_edge[i] = acc
        assert torch.equal(mix_rows(terms, flat, stacked=True), edge_by_edge)  # a GPU's way, here on the CPU
        assert torch.equal(mix_rows(terms, flat), edge_by_edge)
        with monkeypatch.context() as small:  # a large model's rows stacked a few at a time: the same sums
            small.setattr(base, "MIX_BLOCK_BYTES", 3 * 8 * width)
            assert torch.equal(mix_rows(terms, flat, stacked=True), edge_by_edge)
