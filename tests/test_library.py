"""p2pfl as a library: simulate() with the CLI's settings and checks, an algorithm, a model and a dataset
of the user's own (by class, by package.module:name reference, by entry point), and the examples."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import p2pfl
from p2pfl.algorithms import REGISTRY
from p2pfl import testing
from p2pfl.testing import MACHINE_FACTS, check_layout_invariance, check_learns, check_resume, results, run_in_process

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TINY = dict(dataset="synthetic", peers=6, kappa=2, rounds=3, samples_per_peer=40, seed=4, progress=False)
TINY_ARGS = [
    "--dataset",
    "synthetic",
    "--peers",
    "6",
    "--kappa",
    "2",
    "--rounds",
    "3",
    "--samples-per-peer",
    "40",
    "--seed",
    "4",
    "--no-progress",
]
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(filter(None, [str(EXAMPLES), str(ROOT), os.environ.get("PYTHONPATH")])),
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
}


@pytest.fixture
def on_path(monkeypatch):
    """examples/ importable here and in the processes the checks start (mpirun's ranks)."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setenv("PYTHONPATH", ENV["PYTHONPATH"])
    yield
    REGISTRY.pop("lazy-gossip", None)
    sys.modules.pop("lazy_gossip", None)


def test_simulate_returns_the_cli_numbers_and_writes_nothing_without_out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = p2pfl.simulate(algo="dfedavg", **TINY)
    assert list(tmp_path.iterdir()) == []  # out=None: not even runs/
    assert result.run_dir is None and len(result.rows) == 3 and result.config.peers == 6
    done = run_in_process([*TINY_ARGS, "--algo", "dfedavg", "--out", str(tmp_path / "cli")])
    code, err = done.returncode, done.stderr
    assert code == 0, err
    cli = results(tmp_path / "cli")
    assert [{k: v for k, v in r.items() if k not in MACHINE_FACTS} for r in result.rows] == cli["metrics"]
    saved = torch.load(tmp_path / "cli" / "model.pt", weights_only=True)
    assert saved.keys() == result.model_state.keys() and all(
        torch.equal(saved[k], result.model_state[k]) for k in saved
    )
    assert result.series("test_acc")[-1] == (3, result.rows[-1]["test_acc"])


def test_simulate_writes_its_folder_when_asked(tmp_path):
    result = p2pfl.simulate(algo="ntk-dfl", out=tmp_path / "run", ntk_taus=(50, 100), lr=0.1, **TINY)
    assert result.run_dir == tmp_path / "run" and (tmp_path / "run" / "metrics.jsonl").exists()
    assert result.final == json.loads((tmp_path / "run" / "final.json").read_text())


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"peers": 0}, "--peers must be at least 1, got 0"),
        ({"topology": "moebius"}, "unknown topology 'moebius'"),
        ({"learning_rate": 0.1}, "unknown setting(s): learning_rate"),
        # None is a value only where the default is None; a path is a str or a Path (hostile cases of issue 40)
        ({"kappa": None}, "--kappa takes a finite number, not None"),
        ({"seed": None}, "--seed takes an integer, not None"),
        ({"device": None}, "--device takes a name, not None"),
        ({"samples_per_peer": None}, "--samples-per-peer takes an integer, not None"),
        ({"mixing": 3}, "--mixing takes a name, not 3"),
        ({"static": None}, "--static takes true or false, not None"),
        ({"algo": ["dfedavg"]}, "--algo takes an algorithm's name, not ['dfedavg']"),
        ({"config": ["x.toml"]}, "config takes a path (a str or a Path), not ['x.toml']"),
        ({"out": 123}, "out takes a path (a str or a Path), not 123"),
        ({"algo": "dfedavg", "prox_mu": 0.1}, "--prox-mu does not apply to --algo dfedavg"),
    ],
)
def test_a_bad_setting_raises_config_error_with_the_cli_message(settings, message):
    with pytest.raises(p2pfl.ConfigError, match=re.escape(message)):
        p2pfl.simulate(**settings)


def test_simulate_never_exits_the_interpreter():
    with pytest.raises(p2pfl.DivergenceError):
        p2pfl.simulate(algo="dfedavg", lr=1e30, **TINY)


@pytest.mark.mpi
def test_an_algorithm_by_class_by_reference_and_under_mpirun(on_path, tmp_path):
    from lazy_gossip import LazyGossip

    by_class = p2pfl.simulate(algo=LazyGossip, keep=0.3, out=tmp_path / "class", **TINY)
    args = [*TINY_ARGS, "--algo", "lazy_gossip:LazyGossip", "--keep", "0.3"]
    done = run_in_process([*args, "--out", str(tmp_path / "reference")])
    code, err = done.returncode, done.stderr
    assert code == 0, err
    assert results(tmp_path / "class") == results(tmp_path / "reference")
    assert 'algo = "lazy_gossip:LazyGossip"' in (tmp_path / "reference" / "config.toml").read_text()
    assert by_class.rows[-1]["test_acc"] == results(tmp_path / "reference")["metrics"][-1]["test_acc"]
    # the conformance checks of the built-in algorithms, on it
    check_learns(args, tmp_path / "learns")
    check_layout_invariance(args, tmp_path / "layout", ranks=2)
    check_resume(args, tmp_path / "resume")


@pytest.mark.mpi
def test_simulate_by_class_under_mpirun_gives_every_rank_the_result(on_path, tmp_path):
    """A script calling simulate() on 2 ranks: each rank gets the rows, the rows of one process."""
    from lazy_gossip import LazyGossip

    script = tmp_path / "script.py"
    script.write_text(
        "import json, p2pfl\nfrom p2pfl.testing import MACHINE_FACTS\nfrom lazy_gossip import LazyGossip\n"
        f"r = p2pfl.simulate(algo=LazyGossip, keep=0.3, **{TINY!r})\n"
        "print('ROWS', json.dumps([{k: v for k, v in x.items() if k not in MACHINE_FACTS} "
        "for x in r.rows]))\n"
    )
    run = subprocess.run(
        testing.mpirun_command(2, sys.executable, str(script)), capture_output=True, text=True, env=ENV, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [line for line in run.stdout.splitlines() if line.startswith("ROWS")]
    assert len(lines) == 2 and lines[0] == lines[1]  # every rank got it
    here = [
        {k: v for k, v in row.items() if k not in MACHINE_FACTS}
        for row in p2pfl.simulate(algo=LazyGossip, keep=0.3, **TINY).rows
    ]
    assert json.loads(lines[0].split(" ", 1)[1]) == here


def test_a_model_of_ones_own_by_reference(on_path, tmp_path):
    args = [*TINY_ARGS, "--algo", "fedavg", "--model", "tiny_net:make_net"]
    rows = check_learns(args, tmp_path)
    assert "model tiny_net:make_net: 2,410 parameters" in (tmp_path / "learns" / "config.toml").read_text()
    assert rows
    done = run_in_process([*TINY_ARGS, "--model", "tiny_net:nothing", "--out", str(tmp_path / "bad")])
    code, err = done.returncode, done.stderr
    assert code == 2 and "--model tiny_net:nothing: tiny_net has no nothing" in err


LOADER = """
import torch

def load():
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(4, 12, generator=g) * 2
    def draw(n):
        y = torch.arange(n) % 4
        return centres[y] + torch.randn(n, 12, generator=g), y
    train_x, train_y = draw(800)
    test_x, test_y = draw(200)
    return train_x, train_y, test_x, test_y, torch.arange(800) % 8   # owners: 8 writers

def not_data():
    return 42
"""


@pytest.mark.parametrize("partition", ["dirichlet", "iid", "classes", "writers"])
def test_a_dataset_of_ones_own_takes_every_partition(partition, tmp_path, monkeypatch):
    (tmp_path / "mydata.py").write_text(LOADER)
    monkeypatch.syspath_prepend(str(tmp_path))
    args = [
        *TINY_ARGS,
        "--dataset",
        "mydata:load",
        "--partition",
        partition,
        "--peers",
        "8",
        "--algo",
        "fedavg",
        "--lr",
        "0.1",
    ]
    rows = check_learns(args, tmp_path / partition)
    assert rows[-1]["test_acc"] > 0.3
    sys.modules.pop("mydata", None)


def test_a_bad_dataset_reference_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "mydata.py").write_text(LOADER)
    monkeypatch.syspath_prepend(str(tmp_path))
    for reference, message in [
        ("mydata:not_data", "must return (train_x, train_y, test_x, test_y[, owners])"),
        ("nowhere:load", "cannot import nowhere"),
    ]:
        done = run_in_process([*TINY_ARGS, "--dataset", reference, "--out", str(tmp_path / "x")])
        code, err = done.returncode, done.stderr
        assert code == 2 and message in err, err
    sys.modules.pop("mydata", None)


@pytest.mark.subprocess
def test_an_installed_package_registers_by_entry_point(tmp_path):
    """A distribution on the path whose metadata names its algorithm in the p2pfl.algorithms group."""
    site = tmp_path / "site"
    (site / "ep_gossip-1.0.dist-info").mkdir(parents=True)
    (site / "ep_gossip-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-gossip\nVersion: 1.0\n")
    (site / "ep_gossip-1.0.dist-info" / "entry_points.txt").write_text(
        "[p2pfl.algorithms]\nep-gossip = ep_gossip:EntryGossip\n"
    )
    (site / "ep_gossip.py").write_text(
        (EXAMPLES / "lazy_gossip.py")
        .read_text()
        .replace('name = "lazy-gossip"', 'name = "ep-gossip"')
        .replace("class LazyGossip(", "class EntryGossip(")
    )
    env = {**ENV, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), str(ROOT), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "p2pfl.run",
            *TINY_ARGS,
            "--algo",
            "ep-gossip",
            "--keep",
            "0.2",
            "--out",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert len(results(tmp_path / "run")["metrics"]) == 3


@pytest.mark.parametrize(
    "example, args",
    [
        ("sweep_keep.py", ["--rounds", "2"]),
    ],
)
@pytest.mark.subprocess
def test_the_examples_run(example, args, tmp_path):
    run = subprocess.run(
        [sys.executable, str(EXAMPLES / example), *args, "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=600,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert (tmp_path / "out" / "compare.png").stat().st_size > 0 and "keep=0.5" in run.stdout


def test_tensorboard_holds_the_metrics_rows(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    done = run_in_process([*TINY_ARGS, "--algo", "dfedavg", "--tensorboard", "--out", str(tmp_path / "run")])

    code, err = done.returncode, done.stderr
    assert code == 0, err
    rows = results(tmp_path / "run")["metrics"]
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"test_acc", "client_acc_mean", "train_loss", "bytes_by_phase/average"} <= tags
    assert [(e.step, pytest.approx(e.value)) for e in events.Scalars("test_acc")] == [
        (r["round"], r["test_acc"]) for r in rows
    ]
    with pytest.raises(p2pfl.ConfigError, match="give out="):
        p2pfl.simulate(tensorboard=True, **TINY)


def test_tensorboard_without_its_package_is_one_line(tmp_path, monkeypatch):
    from p2pfl.measure import tensorboard_log as tracking

    monkeypatch.setattr(tracking.importlib.util, "find_spec", lambda name: None)
    done = run_in_process([*TINY_ARGS, "--tensorboard", "--out", str(tmp_path / "run")])
    code, err = done.returncode, done.stderr
    assert code == 2 and "--tensorboard needs the tensorboard package" in err and not (tmp_path / "run").exists()


@pytest.mark.skipif(
    not Path("/usr/share/datasets/fashion-mnist").exists() and "P2PFL_DATA" not in os.environ,
    reason="Fashion-MNIST (Debian's dataset-fashion-mnist) is not installed",
)
@pytest.mark.subprocess
def test_the_readme_python_quickstart_runs_in_a_fresh_interpreter(tmp_path):
    readme = (ROOT / "README.md").read_text()
    code = readme.split("## Python quickstart", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    run = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [line.split() for line in run.stdout.splitlines()]
    assert [int(line[0]) for line in lines] == [1, 2, 3] and all(0 < float(line[1]) <= 1 for line in lines)
    assert list(tmp_path.iterdir()) == []  # out=None: nothing written


def test_the_readme_algorithm_list_is_generated():
    from p2pfl.docs import LIST_BEGIN, LIST_END, algorithm_list

    readme = (ROOT / "README.md").read_text()
    assert readme.split(LIST_BEGIN, 1)[1].split(LIST_END, 1)[0].strip() == algorithm_list().strip()
    assert len(readme.splitlines()) <= 250


@pytest.mark.parametrize("dataset", ["reversed_views", "grad_tensors"])
def test_valid_arrays_of_unusual_layout_load_as_their_values(tmp_path, monkeypatch, dataset):
    """Negative strides and tensors that require grad crashed where the data enters; they are data."""
    done = run_hostile(tmp_path, monkeypatch, dataset, None, "--samples-per-peer", "8")
    assert done.returncode == 0, done.stderr[-2000:]


def test_simulate_stopped_and_resumed_equals_the_uninterrupted_run(tmp_path):
    settings = dict(TINY, rounds=4)
    whole = p2pfl.simulate(algo="dfedavgm", **settings)
    with testing.stopping_after_first_round(), pytest.raises(p2pfl.Interrupted, match="round 1"):
        p2pfl.simulate(algo="dfedavgm", out=tmp_path / "cut", **settings)
    again = p2pfl.simulate(resume=tmp_path / "cut", progress=False)
    assert [r["test_acc"] for r in again.rows] == [r["test_acc"] for r in whole.rows] and len(again.rows) == 4
    with pytest.raises(p2pfl.ConfigError, match="--resume continues"):
        p2pfl.simulate(resume=tmp_path / "cut", lr=0.5)


def run_hostile(tmp_path, monkeypatch, dataset: str, model: str | None, *extra: str):
    """A tiny run in this process on the HOSTILE module's dataset (and model, where named)."""
    (tmp_path / "hostile.py").write_text(HOSTILE)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("hostile", None)
    args = ["--dataset", f"hostile:{dataset}", "--peers", "4", "--kappa", "2", "--rounds", "1", "--no-progress"]
    args += ["--model", f"hostile:{model}"] if model else []
    return run_in_process([*args, *extra, "--out", str(tmp_path / "run")])


HOSTILE = """
import numpy as np
import torch
from torch import nn

def good():
    y = np.arange(40) % 4
    return np.random.default_rng(0).normal(size=(40, 6)) + y[:, None], y, np.ones((8, 6)), np.arange(8) % 4

def reversed_views():  # numpy views with negative strides: valid data
    x, y, tx, ty = good()
    return x[::-1], y[::-1], tx[::-1], ty[::-1]

def grad_tensors():  # tensors that require grad: valid data
    x, y, tx, ty = good()
    return torch.tensor(x, requires_grad=True), torch.tensor(y), torch.tensor(tx, requires_grad=True), torch.tensor(ty)

def typo():  # one label of 5000 among 0-3
    x, y, tx, ty = good()
    y[3] = 5000
    return x, y, tx, ty

def huge_label():  # one label of 2**40: nothing may be sized by it (a set of its range grew past 8 GB)
    x, y, tx, ty = good()
    y[3] = 2**40
    return x, y, tx, ty

def negative():
    x, y, tx, ty = good()
    ty[0] = -1
    return x, y, tx, ty

def infinite():
    x, y, tx, ty = good()
    x[0, 0] = np.inf
    return x, y, tx, ty

def nan_test():
    x, y, tx, ty = good()
    tx[1, 2] = np.nan
    return x, y, tx, ty

def other_width():
    x, y, tx, ty = good()
    return x, y, tx[:, :5], ty

def strings():
    x, y, tx, ty = good()
    return x.astype(str), y, tx, ty

def flat():
    x, y, tx, ty = good()
    return x[:, 0], y, tx, ty

def labels_2d():
    x, y, tx, ty = good()
    return x, y[:, None], tx, ty

def empty_test():
    x, y, tx, ty = good()
    return x, y, tx[:0], ty[:0]

def short_owners():
    return (*good(), np.arange(30))

def raises():
    return {}["no such key"]

def three_outputs(shape, n):
    return nn.Linear(6, 3)

def wrong_width(shape, n):
    return nn.Linear(5, n)

def tuple_output(shape, n):
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(6, n)
        def forward(self, x):
            return self.a(x), x
    return Two()

def no_parameters(shape, n):
    return nn.Identity()

def double(shape, n):
    return nn.Linear(6, n).double()

def bad_owners():  # an owner of 0.5
    return (*good(), np.arange(40) / 2)

def negative_owners():
    return (*good(), np.arange(40) - 1)

def no_width():  # samples of no features
    x, y, tx, ty = good()
    return x[:, :0], y, tx[:, :0], ty

def frozen(shape, n):  # parameters, none of them trained
    net = nn.Linear(6, n)
    net.requires_grad_(False)
    return net

def integer_scores(shape, n):
    class Argmax(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(6, n)
        def forward(self, x):
            return (self.a(x) > 0).long()
    return Argmax()

def detached(shape, n):
    class Detached(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(6, n)
        def forward(self, x):
            return self.a(x).detach()
    return Detached()

def self_changing(shape, n):
    class Drift(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(6, n)
        def forward(self, x):
            with torch.no_grad():
                self.a.weight.add_(1.0)
            return self.a(x)
    return Drift()

def dropout(shape, n):
    return nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.5), nn.Linear(8, n))

def exits():
    import sys
    sys.exit(0)
"""


@pytest.mark.parametrize(
    "dataset,model,needle",
    [
        (
            "typo",
            None,
            "labels must be the classes 0..C-1, each with training samples; they reach 5000, but 4996 of those",
        ),
        ("huge_label", None, "they reach 1099511627776, but 1099511627772 of those classes have no training sample"),
        ("negative", None, "a label is -1"),
        ("infinite", None, "train_x holds NaN or inf"),
        ("nan_test", None, "test_x holds NaN or inf"),
        ("other_width", None, "test_x's samples are (5,), train_x's (6,)"),
        ("strings", None, "train_x holds <U32 values, not numbers"),
        ("flat", None, "train_x has shape (40,); it must be (samples, features...)"),
        ("labels_2d", None, "train_y must hold one integer class per sample (40), not torch.int64 of shape (40, 1)"),
        ("empty_test", None, "test_x has shape (0, 6)"),
        ("short_owners", None, "owners must name one owner per training sample (40), not shape (30,)"),
        ("raises", None, "--dataset hostile:raises (loading its data) raised KeyError; its traceback:"),
        ("good", "three_outputs", "gave shape (2, 3); p2pfl needs one tensor of shape (2, 4)"),
        ("good", "wrong_width", "(a forward pass of 2 inputs of shape (6,)) raised RuntimeError; its traceback:"),
        ("good", "tuple_output", "gave a tuple; p2pfl needs one tensor of shape (2, 4)"),
        ("good", "no_parameters", "has no parameters to train"),
        ("good", "double", "has torch.float64 parameters; p2pfl trains float32"),
        ("bad_owners", None, "owners must be whole numbers or names, not float64 values"),
        ("negative_owners", None, "owners are whole numbers >= 0 or names; one is -1"),
        (
            "no_width",
            None,
            "train_x has shape (40, 0); it must be (samples, features...) with at least one sample and one feature",
        ),
        ("good", "frozen", "has no parameters to train (none requires grad)"),
        ("good", "integer_scores", "returns int64 scores; p2pfl needs float ones"),
        ("good", "detached", "returns scores that do not depend on its parameters (detached?)"),
        ("good", "self_changing", "its forward pass changed its own parameters"),
        (
            "good",
            "dropout",
            "the model's layer '1' (Dropout) draws random numbers, which one batch of peers (vmap) cannot: run with --no-batch",
        ),
        ("exits", None, "--dataset hostile:exits (loading its data) called sys.exit(0)"),
    ],
)
def test_what_a_plug_in_returns_is_checked_where_it_enters(tmp_path, monkeypatch, dataset, model, needle):
    """The hostile cases of issue 40: each ran silently with wrong numbers (5,001 classes at 0.0%) or
    ended in a traceback from deep inside p2pfl. Each is one line naming the plug-in and the field, exit
    2; where the user's code raised, that line and then their frames only."""
    done = run_hostile(tmp_path, monkeypatch, dataset, model, "--samples-per-peer", "8")
    assert done.returncode == 2 and needle in done.stderr, done.stderr[-2000:]
    assert done.stderr.startswith("p2pfl: error: ")
    if "traceback" in needle:  # their frames (their module's, torch's for their Linear), none of p2pfl's
        frames = done.stderr.split("traceback:", 1)[1]
        assert "p2pfl/" not in frames and ("hostile.py" in frames or "torch" in frames), frames
    else:
        assert done.stderr.count("\n") == 1


def test_a_model_that_draws_random_numbers_runs_with_no_batch_as_its_refusal_says(tmp_path, monkeypatch):
    done = run_hostile(tmp_path, monkeypatch, "good", "dropout", "--samples-per-peer", "8", "--no-batch")
    assert done.returncode == 0, done.stderr[-2000:]


ALGORITHMS = {
    "shrink": (
        "class Shrink(p2pfl.Algorithm):\n    name = 'shrink'\n    summary = 'x'\n"
        "    def round(self, k):\n        self.ctx.flat = self.ctx.flat[:, :10]\n",
        "round 1 left ctx.flat as (4, 10); it must stay (4, ",
    ),
    "losses": (
        "class Losses(p2pfl.Algorithm):\n    name = 'losses'\n    summary = 'x'\n"
        "    def round(self, k):\n        return p2pfl.Round([0.0])\n",
        "round 1 returned losses list; Round.losses is None or one loss per peer (4,)",
    ),
    "bare": (
        "class Bare(p2pfl.Algorithm):\n    name = 'bare'\n    summary = 'x'\n"
        "    def round(self, k):\n        return self.ctx.flat[:, 0]\n",
        "round 1 returned Tensor; a round returns p2pfl.Round(losses, ...)",
    ),
    "state": (
        "class State(p2pfl.Algorithm):\n    name = 'state'\n    summary = 'x'\n    state = {'x': 'rows'}\n",
        "state maps attribute names to one of peer, server, pooled; got x: 'rows'",
    ),
    "core": (
        "from dataclasses import dataclass\n@dataclass(frozen=True)\nclass S:\n"
        "    lr: float = p2pfl.option(0.1, 'x')\n"
        "class Core(p2pfl.Algorithm):\n    name = 'core'\n    summary = 'x'\n    Settings = S\n",
        "its setting 'lr' is named like the run's own --lr",
    ),
    "dict": (
        "class Dict(p2pfl.Algorithm):\n    name = 'dict'\n    summary = 'x'\n    Settings = {'keep': 0.5}\n",
        "Settings must be a dataclass of p2pfl.option fields, not dict",
    ),
    "twin": (
        "class Twin(p2pfl.Algorithm):\n    name = 'dfedavg'\n    summary = 'x'\n",
        "two algorithms are named 'dfedavg'",
    ),
    "roundless": (
        "class Roundless(p2pfl.Algorithm):\n    name = 'roundless'\n    summary = 'x'\n",
        "has no round(self, round_index)",
    ),
    "typed": (
        "from dataclasses import dataclass\n@dataclass(frozen=True)\nclass S:\n"
        "    table: dict = p2pfl.option(None, 'x')\n"
        "class Typed(p2pfl.Algorithm):\n    name = 'typed'\n    summary = 'x'\n    Settings = S\n"
        "    def round(self, k):\n        return p2pfl.Round(None)\n",
        "its setting 'table' is of type dict; settings are bool, int, float, str or a list of ints",
    ),
    "double": (
        "class Double(p2pfl.Algorithm):\n    name = 'double'\n    summary = 'x'\n"
        "    def round(self, k):\n        self.ctx.flat = self.ctx.flat.double()\n        return p2pfl.Round(None)\n",
        "round 1 left ctx.flat as float64; it must stay float32",
    ),
    "quits": (
        "import sys\nclass Quits(p2pfl.Algorithm):\n    name = 'quits'\n    summary = 'x'\n"
        "    def round(self, k):\n        sys.exit(0)\n",
        "--algo quits: its round called sys.exit(0)",
    ),
}


@pytest.mark.parametrize("case", sorted(ALGORITHMS))
def test_an_algorithm_of_ones_own_is_checked_where_it_enters(tmp_path, monkeypatch, case):
    """Hostile cases of issue 40 that ended in tracebacks from p2pfl's internals: one line each, exit 2."""
    source, needle = ALGORITHMS[case]
    (tmp_path / f"algo_{case}.py").write_text("import p2pfl\n" + source)
    monkeypatch.syspath_prepend(str(tmp_path))
    cls = source.split("class ")[-1].split("(")[0]
    done = run_in_process(
        [*TINY_ARGS, "--peers", "4", "--rounds", "1", "--algo", f"algo_{case}:{cls}", "--out", str(tmp_path / "run")]
    )
    REGISTRY.pop(case, None)
    assert done.returncode == 2 and needle in done.stderr and done.stderr.count("\n") == 1, done.stderr[-2000:]


@pytest.mark.parametrize("hook", ["__init__", "round", "finish"])
def test_an_algorithms_own_exception_is_one_line_then_its_frames(tmp_path, monkeypatch, hook):
    """Hostile cases of issue 50: an exception in a user's algorithm was a long traceback through p2pfl."""
    body = {
        "__init__": "    def __init__(self, ctx, settings=None):\n        raise ValueError('mine')\n",
        "round": "",
        "finish": "    def finish(self, run_dir):\n        raise ValueError('mine')\n",
    }[hook]
    source = (
        "import p2pfl\nclass Raises(p2pfl.Algorithm):\n    name = 'raises'\n    summary = 'x'\n"
        + body
        + "    def round(self, k):\n"
        + ("        raise ValueError('mine')\n" if hook == "round" else "        return p2pfl.Round(None)\n")
    )
    (tmp_path / "algo_raises.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("algo_raises", None)
    done = run_in_process(
        [*TINY_ARGS, "--peers", "4", "--rounds", "1", "--algo", "algo_raises:Raises", "--out", str(tmp_path / "run")]
    )
    REGISTRY.pop("raises", None)
    head, _, frames = done.stderr.partition("its traceback:")
    assert done.returncode == 2 and f"--algo raises: its {hook} raised ValueError" in head, done.stderr[-2000:]
    assert "algo_raises.py" in frames and "ValueError: mine" in frames and "p2pfl/" not in frames, frames


def test_tensorboard_that_is_missing_or_broken_is_one_line_and_a_resume_may_leave_it(tmp_path, monkeypatch):
    """Hostile cases of issue 40: installed but failing to import was a traceback; a run started with
    --tensorboard could not be resumed with --no-tensorboard where the package is missing."""
    import importlib.util

    args = [*TINY_ARGS, "--algo", "dfedavg", "--tensorboard", "--out", str(tmp_path / "run")]
    cut = run_in_process(args, stop_after_first_round=True)
    assert cut.returncode == 130, cut.stderr[-2000:]
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # installed, but its import fails
    broken = run_in_process([*TINY_ARGS, "--tensorboard", "--out", str(tmp_path / "other")])
    assert broken.returncode == 2 and "installed but does not load (ModuleNotFoundError" in broken.stderr, broken.stderr
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    refused = run_in_process(["--resume", str(tmp_path / "run"), "--no-progress"])
    assert refused.returncode == 2 and "--tensorboard needs the tensorboard package" in refused.stderr
    resumed = run_in_process(["--resume", str(tmp_path / "run"), "--no-tensorboard", "--no-progress"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]


@pytest.mark.parametrize(
    "source,needle,theirs",
    [
        ("def load(:\n    pass\n", "(importing broken) raised SyntaxError; its traceback:", "def load(:"),
        (
            "import no_such_package_here\n",
            "(importing broken) raised ModuleNotFoundError; its traceback:",
            "import no_such_package_here",
        ),
        ("raise RuntimeError('at import')\n", "(importing broken) raised RuntimeError; its traceback:", "at import"),
    ],
)
def test_a_plug_in_that_fails_to_import_shows_its_own_frames(tmp_path, monkeypatch, source, needle, theirs):
    (tmp_path / "broken.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("broken", None)
    done = run_in_process([*TINY_ARGS, "--dataset", "broken:load", "--out", str(tmp_path / "run")])
    frames = done.stderr.split("traceback:", 1)[-1]
    assert done.returncode == 2 and needle in done.stderr and theirs in frames, done.stderr
    assert "p2pfl/" not in frames and "importlib" not in frames, frames


def test_simulate_takes_a_graph_and_a_model_function_as_a_notebook_defines_them():
    """It said "--topology takes a name, not <function ...>": the function had to live in a module on the
    path. Functions defined in place (here inside the test: not importable) run, and a second function of
    the same name is told apart from the first."""
    import math

    import networkx as nx
    from torch import nn

    import p2pfl

    def graph(peers, round_index, seed):
        g = nx.cycle_graph(peers)
        g.add_edge(0, peers // 2)
        return g

    def model(input_shape, n_classes):
        return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), n_classes))

    common = dict(peers=6, rounds=1, dataset="synthetic", out=None, progress=False)
    result = p2pfl.simulate("dpsgd", topology=graph, model=model, **common)
    assert result.config.topology.endswith("graph") and result.config.model.endswith("model")
    assert len(result.rows) == 1 and result.model_state["1.weight"].shape[0] == 10

    def graph(peers, round_index, seed):  # noqa: F811 - another function of the same name
        return nx.path_graph(peers)

    again = p2pfl.simulate("dpsgd", topology=graph, **common)
    assert (
        again.config.topology != result.config.topology
        and again.rows[0]["spectral_gap"] < result.rows[0]["spectral_gap"]
    )


def test_the_own_graph_example_sets_a_function_and_a_weighted_file_beside_the_families(on_path, capsys):
    import own_graph

    rows = own_graph.main(["--peers", "8", "--rounds", "2"])
    by = {row["graph"]: row for row in rows}
    assert len(rows) == 5 and all(0 < row["gap"] <= 1 and 0 <= row["acc"] <= 1 for row in rows)
    assert (
        by["torus"]["gap"] > by["ring"]["gap"] and "weighted ring (a file, --mixing given)" in capsys.readouterr().out
    )
    sys.modules.pop("own_graph", None)
