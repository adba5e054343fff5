"""The shipped presets: found by name from any folder, listed, and every one runs (one tiny round of each
of its methods, on small files in Fashion-MNIST's and CIFAR's layouts)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from p2pfl import presets
from p2pfl.errors import UserError
from p2pfl.testing import run_in_process
from tests.conftest import write_cifar, write_stripes

# What makes a run tiny, where the preset sets it: peers above 16 become 16 (a 4 x 4 torus, a 4-cube).
# TCT's step is bounded by its features' largest eigenvalue, which the striped images set, not
# Fashion-MNIST's: the tiny runs take the bound (auto).
TINY = {
    "rounds": "1",
    "samples-per-peer": "20",
    "train-samples": "1200",
    "test-samples": "60",
    "eval-every": "1",
    "local-epochs": "1",
    "local-steps": "2",
    "clients-per-round": "4",
    "tct-stage1-rounds": "1",
    "tct-stage2-rounds": "1",
    "tct-local-steps": "2",
    "cyclic-rounds": "1",
    "ft-trials": "1",
    "ft-epochs": "1",
    "ft-new-clients": "2",
    "ft-new-samples": "8",
}


def runs_of(preset: presets.Preset, out: Path) -> list[dict]:
    """One run of each method (or, for the figures, each algorithm) the experiment would start."""
    from launch.experiment import experiment_runs

    chosen = {}
    for run in experiment_runs(preset.path, out):
        argv = run["argv"]
        chosen.setdefault(run.get("method") or argv[argv.index("--algo") + 1], argv[argv.index("p2pfl.run") + 1 :])
    return list(chosen.items())


def tiny(argv: list[str], data: Path) -> list[str]:
    """argv at tiny scale, on small files in the dataset's layout under data."""
    argv = shrunk(argv)
    dataset = argv[argv.index("--dataset") + 1] if "--dataset" in argv else "fashion-mnist"
    if dataset.startswith("cifar"):
        folder = write_cifar(data / dataset, dataset, n_train=400, n_test=100)
    elif dataset == "fashion-mnist":
        folder = data / "fmnist"
        if not folder.exists():
            folder.mkdir(parents=True)
            write_stripes(folder, 10, 1500, 100)
    else:
        return argv
    return [*argv, "--data-dir", str(folder)]


def shrunk(argv: list[str]) -> list[str]:
    """argv with the TINY sizes, at most 16 peers."""
    argv = list(argv)
    for i, token in enumerate(argv[:-1]):
        flag = token.removeprefix("--")
        if flag in TINY:
            argv[i + 1] = TINY[flag]
        elif flag == "peers":
            argv[i + 1] = str(min(16, int(argv[i + 1])))
    if "--cyclic-rounds" in argv:  # phase 1, then one round of phase 2
        argv += ["--rounds", "2"]
    if "--algo" in argv and argv[argv.index("--algo") + 1] == "tct":
        argv += ["--tct-lr", "auto"]
    return argv


HEAVY_ALGOS = {"ntk-dfl", "tct", "cyclic"}  # a tiny round still takes their NTK math or a pre-training stage
HEAVY_MODELS = {"cnn-cifar", "resnet8"}  # the largest conv nets (FedAvg-FT's, the optimizers' paper scale: 3-10 s)


def _heavy(settings: dict) -> bool:
    return settings.get("algo") in HEAVY_ALGOS or settings.get("model") in HEAVY_MODELS


def _settings(argv: list[str]) -> dict:
    return {key: argv[argv.index(f"--{key}") + 1] for key in ("algo", "model") if f"--{key}" in argv}


def cases():
    """Each preset's tiny round, once where two presets' runs shrink to the same command (a paper preset
    and its reduced one differ in scale only); a heavy one (its algorithm or model) is marked slow, the rest
    run in make test-fast (1-3.5 s each here)."""
    out, seen = [], set()
    for preset in presets.presets():
        if preset.path.parent == presets.EXPERIMENTS:
            for method, argv in runs_of(preset, Path("x")):
                shrunk_argv = shrunk(argv)
                del shrunk_argv[shrunk_argv.index("--out") : shrunk_argv.index("--out") + 2]
                if tuple(shrunk_argv) in seen:  # a paper preset's twin of its reduced one's: one tiny run does
                    continue
                seen.add(tuple(shrunk_argv))
                marks = [pytest.mark.slow] if _heavy(_settings(argv)) else []
                out.append(pytest.param(preset, method, id=f"{preset.name}:{method}", marks=marks))
        else:
            marks = [pytest.mark.slow] if _heavy(tomllib.loads(preset.path.read_text())) else []
            out.append(pytest.param(preset, None, id=preset.name, marks=marks))
    return out


@pytest.mark.parametrize("preset,method", cases())
def test_every_preset_runs_one_tiny_round(preset, method, tmp_path):
    if method is None:
        values = tomllib.loads(preset.path.read_text())
        given = [
            a for key in values if key in TINY or key in ("peers", "dataset") for a in (f"--{key}", str(values[key]))
        ]
        argv = [*tiny(["--config", preset.name, *given], tmp_path), "--device", "cpu"]
    else:
        argv = [*tiny(dict(runs_of(preset, tmp_path))[method], tmp_path), "--device", "cpu"]
    done = run_in_process([*argv, "--out", str(tmp_path / "run"), "--overwrite", "--no-progress"])
    assert done.returncode == 0, (argv, done.stderr[-2000:])
    assert (tmp_path / "run" / "metrics.jsonl").read_text().strip()


def test_presets_are_listed_with_the_command_that_takes_them():
    listed = presets.listing()
    assert len(presets.presets()) >= 23
    for preset in presets.presets():
        assert preset.name in listed and preset.purpose, preset.name
    assert "python -m launch.table tct-fmnist-reduced" in listed
    assert "python -m p2pfl.run --config dfedavg-fmnist300" in listed


def test_a_name_finds_its_preset_and_the_wrong_kind_names_its_command(tmp_path):
    assert presets.find("dfedavg-fmnist300") == presets.RUNS / "dfedavg-fmnist300.toml"
    assert presets.find("tct-fmnist-reduced.toml", "experiment").parent == presets.EXPERIMENTS
    with pytest.raises(UserError, match="is an experiment: python -m launch.table tct-fmnist-reduced"):
        presets.find("tct-fmnist-reduced")
    with pytest.raises(UserError, match="no preset of that name"):
        presets.find("no-such-preset")
    mine = tmp_path / "dfedavg-fmnist300.toml"  # a file of one's own comes first
    mine.write_text('algo = "dfedavg"\n')
    assert presets.find(str(mine)) == mine


@pytest.mark.subprocess
def test_a_preset_by_name_runs_from_another_folder(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "p2pfl.run", "--config", "dfedavg-fmnist300", "--rounds", "1", "--peers", "8",
         "--samples-per-peer", "8", "--local-epochs", "1", "--dataset", "synthetic", "--out", "run", "--no-progress"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    config = tomllib.loads((tmp_path / "run" / "config.toml").read_text())
    assert config["lr"] == 0.1 and config["local_epochs"] == 1  # the preset's lr, the flag's epochs


def test_the_api_reference_covers_every_public_name_and_is_current():
    """docs/api.md is generated from the docstrings: every name of p2pfl.__all__ has its own entry and its
    own docstring (not a dataclass's generated signature), and the page is what the generator writes."""
    import inspect

    import p2pfl
    from analysis.compare import compare
    from p2pfl.api_reference import own_doc, reference
    from p2pfl.docs import API_BEGIN, API_END

    page = (Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text()
    block = page.split(API_BEGIN, 1)[1].split(API_END, 1)[0].strip()
    assert block == reference(), "docs/api.md is stale: python -m p2pfl.docs docs/api.md"
    for name in p2pfl.__all__:
        assert f"### `{name}`" in block, name
        assert own_doc(getattr(p2pfl, name)), f"p2pfl.{name} has no docstring of its own"
    assert f"`compare{inspect.signature(compare)}`" in page  # the hand-written analysis.compare entry


@pytest.mark.parametrize("kind", ["not UTF-8", "a folder", "a link to nothing", "a named pipe", "not TOML"])
def test_a_broken_file_among_the_presets_is_one_line_naming_it(tmp_path, monkeypatch, kind):
    """A traceback (or a wait forever on a pipe) from the listing and from --config NAME before."""
    import os

    experiments = tmp_path / "experiments"
    experiments.mkdir()
    monkeypatch.setattr(presets, "RUNS", tmp_path)
    monkeypatch.setattr(presets, "EXPERIMENTS", experiments)
    broken = experiments / "broken.toml"
    if kind == "not UTF-8":
        broken.write_bytes(b"# a \xff preset.\n[columns.a]\n")
    elif kind == "a folder":
        broken.mkdir()
    elif kind == "a link to nothing":
        broken.symlink_to(tmp_path / "nowhere")
    elif kind == "a named pipe":
        os.mkfifo(broken)
    else:
        broken.write_text("# an experiment.\n[columns\n")
    with pytest.raises(UserError, match=f"preset {broken} (is not a file|cannot be read|is not valid TOML)"):
        presets.listing()
    if kind != "not TOML":  # found: the tool that reads it says where its TOML breaks
        with pytest.raises(UserError, match=f"preset {broken} "):
            presets.find("broken", "experiment")
