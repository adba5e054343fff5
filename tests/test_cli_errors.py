"""Bad input: one clear line on stderr, exit status 2, no traceback."""
import gzip

import pytest

from p2pfl.run import main
from tests.conftest import run_cli

BAD = [
    (["--topology", "regular", "--kappa", "10", "--peers", "10"], "needs more than 10 peers"),
    (["--topology", "regular", "--kappa", "3", "--peers", "7"], "kappa * peers must be even"),
    (["--topology", "regular", "--kappa", "2.5", "--peers", "10"], "whole degree"),
    (["--topology", "erdos-renyi", "--kappa", "12", "--peers", "10"], "mean degree"),
    (["--topology", "ring", "--peers", "2"], "ring needs at least 3"),
    (["--algo", "nope"], "unknown algorithm 'nope'"),
    (["--topology", "torus"], "unknown topology 'torus'"),
    (["--dataset", "imagenet"], "unknown dataset"),
    (["--partition", "pathological"], "unknown partition"),
    (["--alpha", "0"], "--alpha must be a positive number"),
    (["--alpha", "-1"], "--alpha must be a positive number"),
    (["--rounds", "0"], "--rounds must be at least 1"),
    (["--peers", "0"], "--peers must be at least 1"),
    (["--lr", "-0.1"], "--lr must be positive"),
    (["--momentum", "1.5"], "--momentum must be in"),
    (["--hidden", "100,x"], "comma-separated layer widths"),
    (["--rounds", "many"], "invalid int value"),
    (["--frobnicate"], "unrecognized arguments"),
    (["--ntk-taus", "100"], "does not apply to --algo dfedavg"),
    (["--dataset", "synthetic", "--partition", "iid", "--peers", "10", "--samples-per-peer", "1000"],
     "beyond the dataset"),
    (["--dataset", "synthetic", "--samples-per-peer", "100000"], "beyond the dataset"),
    (["--dataset", "synthetic", "--partition", "classes", "--classes-per-peer", "11"], "exceeds the dataset's 10"),
    (["--config", "/nonexistent/run.toml"], "does not exist"),
]


@pytest.mark.parametrize("argv,needle", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_and_exit_2(argv, needle, capsys, tmp_path):
    code = main([*argv, "--out", str(tmp_path / "run"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1, err
    assert err[0].startswith("p2pfl: error:") and needle in err[0], err[0]


def test_unknown_toml_key(tmp_path, capsys):
    cfg = tmp_path / "run.toml"
    cfg.write_text('algo = "dfedavg"\nlearning_rate = 0.1\n')
    assert main(["--config", str(cfg)]) == 2
    assert "unknown setting(s): learning_rate" in capsys.readouterr().err


def test_missing_data_dir_files(tmp_path, capsys):
    assert main(["--dataset", "mnist", "--data-dir", str(tmp_path), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not found in --data-dir" in err[0]


def test_truncated_data_file(tiny_mnist, tmp_path, capsys):
    path = tiny_mnist / "train-images-idx3-ubyte.gz"
    raw = gzip.open(path).read()
    with gzip.open(path, "wb") as fh:
        fh.write(raw[: len(raw) // 2])
    assert main(["--dataset", "mnist", "--data-dir", str(tiny_mnist), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "truncated" in err[0]


def test_cut_gzip_stream(tiny_mnist, tmp_path, capsys):
    path = tiny_mnist / "t10k-labels-idx1-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-12])
    assert main(["--dataset", "mnist", "--data-dir", str(tiny_mnist), "--out", str(tmp_path / "r")]) == 2
    assert "truncated or corrupt" in capsys.readouterr().err


def test_subprocess_prints_no_traceback():
    result = run_cli("--topology", "regular", "--kappa", "3", "--peers", "5")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr


def test_an_existing_run_folder_is_never_clobbered(tmp_path, capsys):
    """A second run into a finished run's folder is refused before any work; --overwrite replaces it;
    config.toml carries neither out nor overwrite, so --config on it starts a new folder."""
    run = tmp_path / "run"
    args = ["--dataset", "synthetic", "--peers", "4", "--kappa", "2", "--rounds", "1", "--local-epochs", "1",
            "--no-progress", "--out", str(run)]
    assert main(args) == 0
    before = (run / "metrics.jsonl").read_text()
    assert main([*args, "--seed", "3"]) == 2
    assert "already holds files" in capsys.readouterr().err
    assert (run / "metrics.jsonl").read_text() == before
    (tmp_path / "file").write_text("x")
    assert main([*args[:-1], str(tmp_path / "file")]) == 2
    assert "is a file" in capsys.readouterr().err
    assert main([*args, "--seed", "3", "--overwrite"]) == 0
    assert (run / "metrics.jsonl").read_text() != before
    keys = [line.split(" = ")[0] for line in (run / "config.toml").read_text().splitlines() if " = " in line]
    assert "seed" in keys and "out" not in keys and "overwrite" not in keys
