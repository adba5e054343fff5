"""launch.reproduce: the claims' rows resolve to runs, run over their seeds, and the page reads the run
folders (mean and spread, seeds, time, version)."""

from __future__ import annotations

import dataclasses
import os
import re

import pytest

from launch import reproduce


def test_every_row_of_the_claims_names_a_run():
    rows = reproduce.load_rows()
    assert {r.claim for r in rows} >= {"ntk-dfl", "cp-ntk-fl", "tct", "cyclic", "moon", "fedavg-ft-linear", "dispfl"}
    for row in rows:
        args = row.args
        assert "--seed" not in args and "--out" not in args, row.method
        assert len(row.seeds) >= 3 and row.paper and row.headline, row.method


ROWS = """
[[row]]
claim = "toy"
paper = "A toy paper"
headline = "DFedAvg learns the synthetic task"
method = "DFedAvg"
paper_value = "90%"
preset = "dfedavg-fmnist300"
flags = ["--dataset", "synthetic", "--peers", "8", "--rounds", "2", "--local-epochs", "1"]
scale = "tiny"
metric = "test_acc"
take = "last"
page = "cli.md"
seeds = [0, 1]

[[row]]
claim = "toy"
method = "DFedAvg to 99%"
paper_value = "3 rounds"
preset = "dfedavg-fmnist300"
flags = ["--dataset", "synthetic", "--peers", "8", "--rounds", "2", "--local-epochs", "1"]
scale = "tiny"
metric = "test_acc"
take = "rounds_to:0.99"
page = "cli.md"
seeds = [0, 1, 2]
minutes = 1
"""


@pytest.mark.subprocess
def test_run_then_page_from_the_run_folders(tmp_path, monkeypatch):
    rows = tmp_path / "rows.toml"
    rows.write_text(ROWS)
    monkeypatch.chdir(tmp_path)  # a relative --runs is the working folder's (the runs start in the repository)
    common = ["--rows", str(rows), "--runs", "runs"]
    assert reproduce.main(["run", *common, "--max-minutes", "0.5"]) == 0  # the second row is skipped
    assert (tmp_path / "runs" / "toy" / "dfedavg" / "seed1" / "model.pt").is_file()
    assert sorted(p.name for p in (tmp_path / "runs" / "toy").iterdir()) == ["dfedavg"]
    page = tmp_path / "reproduce.md"
    assert reproduce.main(["page", *common, "--out", str(page)]) == 0
    text = page.read_text()
    found = reproduce.outcomes(reproduce.load_rows(rows)[0], tmp_path / "runs")
    values = [o.value for o in found]
    assert [o.seed for o in found] == [0, 1] and all(0 < v <= 1 for v in values)
    assert f"({100 * values[0]:.1f}%, {100 * values[1]:.1f}%)" in text
    assert "| DFedAvg | 90% | **" in text and "| 0, 1 | tiny |" in text
    assert "| DFedAvg to 99% | 3 rounds | not run yet | 0, 1, 2 not run | tiny | about 1 min (not run) |" in text
    import p2pfl

    assert f"| {p2pfl.__version__} |" in text
    assert "`python -m p2pfl.run --config dfedavg-fmnist300 --dataset synthetic" in text
    assert reproduce.main(["run", *common, "--max-minutes", "0.5"]) == 0  # done: nothing runs again
    seed0 = tmp_path / "runs" / "toy" / "dfedavg" / "seed0"
    config = (seed0 / "config.toml").read_text()
    (seed0 / "config.toml").write_text(re.sub(r"(?m)^version = .*$", "version = 3", config))
    assert reproduce.main(["page", *common, "--out", str(page)]) == 2
    (seed0 / "config.toml").write_text(config)
    (seed0 / "final.json").write_text("[1, 2]")
    assert reproduce.main(["page", *common, "--out", str(page)]) == 2
    (seed0 / "final.json").unlink()
    (seed0 / "metrics.jsonl").unlink()
    os.mkfifo(seed0 / "metrics.jsonl")  # read, it would wait forever: a run not finished
    assert reproduce.main(["page", *common, "--out", str(page)]) == 0
    assert "| 1 (0 not run) | tiny |" in page.read_text()


@pytest.mark.parametrize(
    "text,says",
    [
        ('[[row]]\nclaim = "x"\n', "missing"),
        (ROWS.replace('take = "last"', 'take = "final"', 1), "take is last, best, rounds_to"),
        (ROWS.replace('paper = "A toy paper"\n', "", 1), "names its paper and headline"),
        ("", "no [[row]]"),
        (ROWS.replace("seeds = [0, 1]", 'seeds = "0"', 1), "seeds is '0', not a list of integers"),
        (ROWS.replace("minutes = 1", 'minutes = "1"', 1), "minutes is '1', not a number"),
        (ROWS.replace('scale = "tiny"', "scale = 2", 1), "scale is 2, not a string"),
        (ROWS.replace('page = "cli.md"', 'page = "cli.md"\nselect = 3', 1), "select is 3, not a table"),
        (ROWS.replace('claim = "toy"', 'claim = "/tmp/elsewhere"'), "a claim is a folder name under --runs"),
        (ROWS.replace('claim = "toy"', 'claim = "../up"'), "a claim is a folder name under --runs"),
        (ROWS.replace('method = "DFedAvg"', 'method = "../.."', 1), "a method holds a letter or digit"),
    ],
)
def test_a_bad_rows_file_is_one_line_naming_the_row(tmp_path, text, says):
    from p2pfl.errors import UserError

    rows = tmp_path / "rows.toml"
    rows.write_text(text)
    with pytest.raises(UserError, match=re.escape(says)):
        reproduce.load_rows(rows)


@pytest.mark.parametrize("kind", ["missing", "not TOML", "binary", "a folder", "a named pipe", "/dev/zero"])
def test_a_rows_file_that_cannot_be_read_is_one_line_and_never_a_wait(tmp_path, kind, capsys):
    rows = tmp_path / "rows.toml"
    if kind == "not TOML":
        rows.write_text("x = [")
    elif kind == "binary":
        rows.write_bytes(b"\xff\xfe\x00")
    elif kind == "a folder":
        rows.mkdir()
    elif kind == "a named pipe":
        os.mkfifo(rows)
    elif kind == "/dev/zero":
        rows = "/dev/zero"
    assert reproduce.main(["page", "--rows", str(rows), "--out", str(tmp_path / "page.md")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"launch.reproduce: error: --rows {rows}") and err.count("\n") == 1
    assert not (tmp_path / "page.md").exists()


def test_rounds_to_a_target_mean_with_a_decimal_seeds_whole_misses_with_their_best():
    row = dataclasses.replace(reproduce.load_rows()[0], take="rounds_to:0.85")
    found = [reproduce.Outcome(seed, value, 1.0, {}) for seed, value in [(0, 23), (1, 22), (2, 20), (3, None)]]
    assert reproduce.summary(row, found) == "**21.7 ± 1.5** (23, 22, 20, -; not reached in 1)"
    assert reproduce.summary(row, found[:1]) == "**23** (23)"
    missed = [reproduce.Outcome(seed, None, 1.0, {}, best) for seed, best in [(0, 0.794), (1, 0.798)]]
    assert reproduce.summary(row, missed) == "target not reached in 2 of 2 runs (test_acc at most 79.4%, 79.8%)"


def test_virtual_seconds_to_a_target_are_those_of_the_first_row_reaching_it():
    row = dataclasses.replace(reproduce.load_rows()[0], take="sim_time_to:0.7")
    records = [
        {"round": 10, "test_acc": 0.6, "sim_time_s": 0.25},
        {"round": 20, "test_acc": 0.72, "sim_time_s": 0.5},
        {"round": 30, "test_acc": 0.8, "sim_time_s": 0.75},
    ]
    assert reproduce.value_of(row, records, {}) == 0.5
    assert reproduce.value_of(dataclasses.replace(row, take="sim_time_to:0.9"), records, {}) is None
    found = [reproduce.Outcome(seed, value, 1.0, {}) for seed, value in [(0, 0.5), (1, 0.25)]]
    assert reproduce.summary(row, found) == "**0.375 s ± 0.177 s** (0.5 s, 0.25 s)"
