"""The tools beside the run keep the run's contract on ordinary mistakes: one line `TOOL: error: ...`,
exit 2, no traceback, nothing written."""

import contextlib
import importlib
import io
import json

import pytest

from p2pfl import testing
from tests.test_analysis import fake_run

TOOLS = {
    "compare": "analysis.compare",
    "topology": "analysis.topology_views",
    "privacy": "analysis.privacy",
    "table": "launch.table",
    "sweep": "launch.sweep",
    "figures": "analysis.figures",
}


def call(tool, *argv):
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = importlib.import_module(TOOLS[tool]).main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def listing(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def place(tmp_path):
    """A folder with a good run, a file, a folder, an invalid TOML, a run preset and an experiment."""
    fake_run(tmp_path / "run", "dfedavg", 0, [0.3, 0.5])
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "a-folder").mkdir()
    (tmp_path / "bad.toml").write_text("rounds = [")
    (tmp_path / "preset.toml").write_text('dataset = "synthetic"\npeers = 6\nkappa = 2\nrounds = 2\n')
    (tmp_path / "experiment.toml").write_text(
        '[common]\ndataset = "synthetic"\n[columns.a]\npeers = 6\n[fedavg]\nalgo = "fedavg"\n'
    )
    return tmp_path


def _rows(folder, rows, config='algo = "dfedavg"\nrounds = 9\neval_every = 5\n'):
    folder.mkdir(parents=True)
    (folder / "config.toml").write_text(config)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


EVALUATED = [{"round": 1, "test_acc": 0.5}]
CASES = [
    ("compare", lambda t: [_rows(t / "s", EVALUATED, 'p2pfl = "0.3"\n')], "its [p2pfl] table is not p2pfl's"),
    ("compare", lambda t: [_rows(t / "n", EVALUATED, "[p2pfl]\nversion = 3\n")], "its [p2pfl] table is not p2pfl's"),
    ("compare", lambda t: [_rows(t / "c", EVALUATED, "[p2pfl]\ncommit = 1.5\n")], "its [p2pfl] table is not p2pfl's"),
    ("compare", lambda t: [_rows(t / "b", [], "\xff")], "is not valid TOML"),
    ("compare", lambda t: [t / "a-file"], "is not a run folder (a file)"),
    ("compare", lambda t: [_rows(t / "list", [[1, 2]])], "line 1 is not a round's row"),
    ("compare", lambda t: [_rows(t / "noround", [{"test_acc": 0.5}])], "line 1 is not a round's row"),
    ("compare", lambda t: [_rows(t / "empty", [])], "no evaluated round yet (0 rounds done, --eval-every 5)"),
    (
        "compare",
        lambda t: [_rows(t / "running", [{"round": 1, "bytes_sent": 3}, {"round": 2}])],
        "no evaluated round yet (2 rounds done, --eval-every 5)",
    ),
    ("compare", lambda t: [_rows(t / "text", [{"round": 1, "test_acc": "0.5"}])], "test_acc is '0.5', not a number"),
    (
        "compare",
        lambda t: [_rows(t / "text", [{"round": 1, "test_acc": 0.5, "bytes_sent": "9"}])],
        "bytes_sent is '9', not a number",
    ),
    ("compare", lambda t: [t / "run", "--target", "nan"], "--target takes finite numbers, got 'nan'"),
    ("compare", lambda t: [t / "run", "--target", "0.5,inf"], "--target takes finite numbers"),
    (
        "compare",
        lambda t: [t / "run", _rows(t / "regression", [{"round": 1, "test_loss": 0.5}])],
        "their curves do not share an axis",
    ),
    ("compare", lambda t: [t / "run", "--out", t / "a-folder"], "is a folder; give a file name"),
    ("compare", lambda t: [t / "run", "--out", t / "a-file" / "c.png"], "a-file is a file, not a folder"),
    ("compare", lambda t: [t / "run", "--out", t / "c.txt"], "a figure is .png, .pdf, .svg, not .txt"),
    ("compare", lambda t: [t / "run", "--out", t / ("x" * 300 + ".png")], "a name of 304 characters"),
    ("compare", lambda t: [t / "run", "--out", t / ("d/" * 2100 + "c.png")], "characters long; use a shorter path"),
    ("figures", lambda t: [t / "a-folder"], "holds none of the figures' runs"),
    ("figures", lambda t: [t / "missing"], "is not a folder of figure runs"),
    ("topology", lambda t: [t / "missing.toml"], "does not exist"),
    ("topology", lambda t: [t / "bad.toml"], "is not valid TOML"),
    ("topology", lambda t: [t / "preset.toml", "--rounds", 10**9], "--rounds must be in [1, 1000]"),
    ("topology", lambda t: [t / "preset.toml", "--out", t / "a-file"], "is a file; give a folder"),
    ("topology", lambda t: [t / "a-folder"], "is not a run folder (no config.toml)"),
    ("privacy", lambda t: ["--seed", -3, "--out", t / "p"], "--seed must be in [0, 2^63)"),
    ("privacy", lambda t: ["--out", t / "a-file"], "is a file; give a folder"),
    ("table", lambda t: [t / "missing.toml"], "does not exist"),
    ("table", lambda t: [t / "bad.toml"], "is not valid TOML"),
    ("table", lambda t: [t / "preset.toml"], "is not an experiment (no [columns] table)"),
    ("table", lambda t: [t / "experiment.toml", "--out", t / "a-file"], "is a file; give a folder"),
    ("sweep", lambda t: [t / "experiment.toml"], "is an experiment (it has [columns])"),
    ("sweep", lambda t: [t / "missing.toml"], "no preset"),
    ("sweep", lambda t: [t / "bad.toml"], "is not valid TOML"),
    ("sweep", lambda t: [t / "preset.toml", "--seeds", "-1", "--out", t / "s"], "--seeds must be at least 0"),
    ("sweep", lambda t: [t / "preset.toml", "--out", t / "a-file"], "is a file; give a folder"),
    (
        "sweep",
        lambda t: [t / "preset.toml", "--seeds", "0", "--set", "seed=1,2", "--out", t / "s"],
        "--set seed: the sweep sets it itself (--seeds); give the seeds as --seeds 1,2",
    ),
    ("sweep", lambda t: [t / "preset.toml", "--set", "kapa=3", "--out", t / "s"], "--kapa"),
]


@pytest.mark.parametrize("tool,argv,message", CASES, ids=[f"{c[0]}: {c[2][:40]}" for c in CASES])
def test_a_tool_refuses_in_one_line_and_writes_nothing(place, tool, argv, message):
    args = argv(place)
    before = listing(place)
    code, _, err = call(tool, *args)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert (
        lines[0].startswith(f"{TOOLS[tool].split('.')[0] if tool in ('table', 'sweep') else 'analysis'}")
        and message in lines[0]
    ), lines[0]
    assert listing(place) == before


def test_compare_without_a_suffix_writes_and_names_the_png(place):
    code, out, err = call("compare", place / "run", "--out", place / "cmp")
    assert code == 0, err
    assert f"figure: {place / 'cmp.png'}" in out and (place / "cmp.png").exists()


@pytest.mark.subprocess
def test_sweep_resumes_an_interrupted_run_and_refuses_another_presets_folder(tmp_path):
    from launch.sweep import plan

    preset = tmp_path / "p.toml"
    preset.write_text('dataset = "synthetic"\npeers = 6\nkappa = 2\nrounds = 3\nlocal-epochs = 1\n')
    out = tmp_path / "sweep"
    (run,) = plan(preset, [0], {}, out)
    argv = run["argv"][run["argv"].index("p2pfl.run") + 1 :]
    done = testing.run_in_process(argv, stop_after_first_round=True)  # stopped after round 1, checkpointed
    code, err = done.returncode, done.stderr
    assert code == 130, err
    first_row = (out / "base" / "seed0" / "metrics.jsonl").read_text().splitlines()[0]  # its times: this run's
    code, _, err = call("sweep", preset, "--out", out, "--target", "0.1")
    assert code == 0, err
    assert (out / "base" / "seed0" / "metrics.jsonl").read_text().splitlines()[0] == first_row  # resumed, not rerun
    whole = tmp_path / "whole"
    done = testing.run_in_process([*argv[: argv.index("--out")], "--out", str(whole)])
    code, err = done.returncode, done.stderr
    assert code == 0, err
    testing.assert_same_results(whole, out / "base" / "seed0", "a sweep's resumed run")
    other = tmp_path / "q.toml"
    other.write_text('dataset = "synthetic"\npeers = 6\nkappa = 2\nrounds = 3\nlocal-epochs = 2\n')
    before = listing(out)
    code, _, err = call("sweep", other, "--out", out)
    assert code == 2 and "holds a run of other settings (local_epochs 1 there, 2 in this plan)" in err
    assert listing(out) == before


@pytest.mark.subprocess
def test_the_launch_tools_run_from_any_folder(tmp_path):
    import subprocess
    import sys

    for tool in (["launch.sweep"], ["launch.table"], ["analysis", "compare"]):
        done = subprocess.run([sys.executable, "-m", *tool, "--help"], cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0 and "usage:" in done.stdout, (tool, done.stderr[-500:])
