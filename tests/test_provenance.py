"""Which p2pfl wrote a run: every run's config.toml names the version, the commit and the machine, and
the version is one number in every file that states it."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import p2pfl
from p2pfl.runner import provenance
from p2pfl.testing import run_in_process

ROOT = Path(__file__).resolve().parents[1]


def test_a_runs_config_names_the_version_commit_and_machine_and_reads_back(tmp_path):
    args = ["--algo", "dfedavg", "--peers", "6", "--kappa", "2", "--rounds", "1", "--dataset", "synthetic"]
    assert run_in_process([*args, "--out", str(tmp_path / "a"), "--no-progress"]).returncode == 0
    source = tomllib.loads((tmp_path / "a" / "config.toml").read_text())["p2pfl"]
    assert source["version"] == p2pfl.__version__
    assert "-core " in source["machine"] and source["machine"].endswith("no GPU")
    if (ROOT / ".git").exists():
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
        assert source["commit"].split("+")[0] == head.strip()
    # the table is a fact of the run, not a setting: the file runs again as a --config
    again = run_in_process(["--config", str(tmp_path / "a" / "config.toml"), "--out", str(tmp_path / "b")])
    assert again.returncode == 0, again.stderr


def test_outside_a_checkout_the_commit_is_unknown(monkeypatch, tmp_path):
    monkeypatch.setattr(provenance, "SOURCE", tmp_path)
    assert provenance.commit() == "unknown"


def test_the_version_is_one_number_everywhere():
    cff = re.search(r"^version: (\S+)$", (ROOT / "CITATION.cff").read_text(), re.M).group(1)
    changelog = re.search(r"^## (\S+) \(", (ROOT / "CHANGELOG.md").read_text(), re.M).group(1)
    assert cff == changelog == p2pfl.__version__
    assert "version = attr: p2pfl.__version__" in (ROOT / "setup.cfg").read_text()
    assert f"This is p2pfl {p2pfl.__version__} " in (ROOT / "README.md").read_text()
