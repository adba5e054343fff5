"""The house's rules that a run cannot show: a new algorithm is its own module and nothing else; the
registry refuses two algorithms of one name."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

from p2pfl.errors import UserError

from p2pfl.algorithms import REGISTRY
from p2pfl.algorithms.base import Algorithm
from p2pfl.testing import results, run_in_process

# A graph algorithm written outside the package: train, then keep part of the own model and take the
# rest from the neighbourhood average (a lazy gossip step).
LAZY_GOSSIP = Path(__file__).resolve().parents[1] / "examples" / "lazy_gossip.py"

TINY = [
    "--dataset",
    "synthetic",
    "--peers",
    "6",
    "--kappa",
    "2",
    "--samples-per-peer",
    "40",
    "--rounds",
    "3",
    "--no-progress",
    "--seed",
    "2",
]


@pytest.fixture
def lazy_gossip():
    spec = importlib.util.spec_from_file_location("lazy_gossip", LAZY_GOSSIP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        yield module
    finally:
        REGISTRY.pop("lazy-gossip", None)


def test_an_algorithm_outside_the_package_runs_by_name_with_its_own_settings(lazy_gossip, tmp_path):
    package = Path(__file__).resolve().parents[1] / "p2pfl"
    before = subprocess.run(["git", "status", "--porcelain", str(package)], capture_output=True, text=True).stdout
    assert REGISTRY["lazy-gossip"] is lazy_gossip.LazyGossip
    done = run_in_process([*TINY, "--algo", "lazy-gossip", "--keep", "0.25", "--out", str(tmp_path / "a")])
    code, err = done.returncode, done.stderr
    assert code == 0, err
    rows = results(tmp_path / "a")["metrics"]
    assert len(rows) == 3 and rows[-1]["test_acc"] > rows[0]["test_acc"] - 0.05
    assert "keep = 0.25" in (tmp_path / "a" / "config.toml").read_text()
    done = run_in_process([*TINY, "--algo", "lazy-gossip", "--keep", "0", "--out", str(tmp_path / "b")])
    code, err = done.returncode, done.stderr
    assert code == 0, err
    assert results(tmp_path / "b") != results(tmp_path / "a")  # the setting reaches the round
    done = run_in_process([*TINY, "--algo", "lazy-gossip", "--keep", "1", "--out", str(tmp_path / "c")])
    code, err = done.returncode, done.stderr
    assert code == 2 and "--keep must be in [0, 1), got 1.0" in err
    done = run_in_process([*TINY, "--algo", "dfedavg", "--keep", "0.5", "--out", str(tmp_path / "d")])
    code, err = done.returncode, done.stderr
    assert code == 2 and "--keep does not apply to --algo dfedavg (it is a setting of lazy-gossip)" in err
    after = subprocess.run(["git", "status", "--porcelain", str(package)], capture_output=True, text=True).stdout
    assert after == before  # nothing in the package was touched


def test_two_algorithms_of_one_name_are_refused():
    with pytest.raises(UserError, match="two algorithms are named 'dfedavg'"):
        type("Impostor", (Algorithm,), {"name": "dfedavg", "__module__": "elsewhere"})
    assert REGISTRY["dfedavg"].__module__ == "p2pfl.algorithms.graph.dfedavg"


def test_the_cli_lists_a_registered_algorithm(lazy_gossip, capsys):
    with pytest.raises(SystemExit):
        from p2pfl.runner.configure import build_parser

        build_parser("lazy-gossip").parse_args(["--help"])
    out = capsys.readouterr().out
    assert "local SGD, then a lazy step towards the neighbourhood average" in " ".join(out.split())
    assert "--keep X" in out and "share of its own model a peer keeps" in " ".join(out.split())


def test_every_module_of_p2pfl_sits_in_a_layer():
    """lint-imports checks only what its layers name: a module left out would escape the contract."""
    import configparser
    import re

    root = Path(__file__).resolve().parents[1]
    config = configparser.ConfigParser()
    config.read(root / ".importlinter")
    named = set(re.findall(r"[\w.]+", config["importlinter:contract:layers"]["layers"]))
    package = root / "p2pfl"
    modules = {f"p2pfl.{p.stem}" for p in package.glob("*.py") if p.stem != "__init__"}
    modules |= {f"p2pfl.{p.name}" for p in package.iterdir() if (p / "__init__.py").exists()}
    assert modules - named == set(), f"not in any layer of .importlinter: {sorted(modules - named)}"


def modules_below_the_algorithms() -> list[Path]:
    """The source files of every layer .importlinter puts below p2pfl.algorithms."""
    root = Path(__file__).resolve().parents[1]
    text = (root / ".importlinter").read_text().split("layers =", 1)[1].split("\n\n", 1)[0]
    layers = [line.strip() for line in text.strip().splitlines()]
    below = [
        name.strip()
        for line in layers[layers.index("p2pfl.algorithms") + 1 :]
        for name in line.replace("|", ":").split(":")
    ]
    files = []
    for name in below:
        path = root / Path(*name.split("."))
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path.with_suffix(".py")]
    return files


def test_nothing_below_the_algorithm_layer_takes_the_run_context():
    """The RunContext belongs to the algorithm layer: a lower module that took it (a parameter named ctx,
    or one annotated RunContext) would reach through it where import-linter cannot see."""
    import ast

    files = modules_below_the_algorithms()
    assert len(files) > 40 and any(f.name == "metrics.py" for f in files) and any(f.name == "plan.py" for f in files)
    found = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
                    annotation = ast.unparse(arg.annotation) if arg.annotation is not None else ""
                    if arg.arg == "ctx" or "RunContext" in annotation:
                        found.append(f"{path.name}:{node.lineno} {node.name}({arg.arg})")
    assert found == [], found
