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
    (["--topology", "moebius"], "unknown topology 'moebius'"),
    (["--dataset", "imagenet"], "unknown dataset"),
    (["--partition", "pathological"], "unknown partition"),
    (["--alpha", "0"], "--alpha must be a positive number"),
    (["--alpha", "-1"], "--alpha must be a positive number"),
    (["--rounds", "0"], "--rounds must be at least 1"),
    (["--peers", "0"], "--peers must be at least 1"),
    (["--lr", "-0.1"], "--lr must be positive"),
    (["--momentum", "1.5"], "--momentum must be in"),
    (["--hidden", "100,x"], "comma-separated layer widths"),
    (["--rounds", "many"], "--rounds takes an integer, not 'many'"),
    (["--frobnicate"], "unrecognized arguments"),
    (["--ntk-taus", "100"], "does not apply to --algo dfedavg"),
    (
        ["--dataset", "synthetic", "--partition", "iid", "--peers", "10", "--samples-per-peer", "1000"],
        "beyond the dataset",
    ),
    (["--dataset", "synthetic", "--samples-per-peer", "100000"], "beyond the dataset"),
    (["--dataset", "synthetic", "--partition", "classes", "--classes-per-peer", "11"], "exceeds the dataset's 10"),
    (["--config", "/nonexistent/run.toml"], "does not exist"),
]


# Hostile input as a new user would type it; {tmp} is a scratch folder holding the files of FILES.
SYN = ["--dataset", "synthetic", "--rounds", "1", "--local-epochs", "1"]
HOSTILE = [
    # numbers that are not finite, not whole, or out of range
    ([*SYN, "--kappa", "nan"], "--kappa takes a finite number"),
    ([*SYN, "--kappa", "inf"], "--kappa takes a finite number"),
    ([*SYN, "--lr", "nan"], "--lr takes a finite number"),
    ([*SYN, "--lr", "inf"], "--lr takes a finite number"),
    ([*SYN, "--lr", "1e400"], "--lr takes a finite number"),
    ([*SYN, "--weight-decay", "nan"], "--weight-decay takes a finite number"),
    ([*SYN, "--weight-decay", "-1"], "--weight-decay must be non-negative"),
    ([*SYN, "--lr-decay", "nan"], "--lr-decay takes a finite number"),
    ([*SYN, "--lr-decay", "-0.5"], "--lr-decay must be non-negative"),
    ([*SYN, "--momentum", "nan"], "--momentum takes a finite number"),
    ([*SYN, "--comm-timeout", "nan"], "--comm-timeout takes a finite number"),
    ([*SYN, "--comm-timeout", "0"], "--comm-timeout must be positive"),
    ([*SYN, "--alpha", "nan"], "--alpha takes a finite number"),
    ([*SYN, "--seed", "-1"], "--seed must be a whole number"),
    ([*SYN, "--seed", "99999999999999999999"], "--seed must be a whole number"),
    ([*SYN, "--seed", "1.5"], "--seed takes an integer, not '1.5'"),
    ([*SYN, "--rounds", "1e9"], "--rounds takes an integer, not '1e9'"),
    ([*SYN, "--peers=4=5"], "--peers takes an integer, not '4=5'"),
    ([*SYN, "--batch-size", "0"], "--batch-size must be positive"),
    ([*SYN, "--local-epochs", "0"], "--local-epochs must be positive"),
    ([*SYN, "--eval-every", "0"], "--eval-every must be at least 1"),
    ([*SYN, "--test-samples", "0"], "--test-samples must be at least 1"),
    ([*SYN, "--train-samples", "0"], "--train-samples must be at least 1"),
    ([*SYN, "--samples-per-peer", "-1"], "--samples-per-peer must be at least 1"),
    ([*SYN, "--hidden", "0"], "--hidden needs at least one positive width"),
    ([*SYN, "--hidden", ""], "--hidden needs at least one positive width"),
    # sizes that do not fit the data or the machine
    ([*SYN, "--hidden", "100000000"], "more than its"),
    ([*SYN, "--peers", "100000000"], "exceeds the 6,000 training samples"),
    ([*SYN, "--test-samples", "99999999"], "exceeds the 1,000 test samples"),
    ([*SYN, "--algo", "ntk-dfl", "--ntk-projection", "64"], "does not reduce the 64 input features"),
    ([*SYN, "--train-samples", "9999999"], "exceeds the 6000 training samples"),
    ([*SYN, "--algo", "ntk-dfl", "--ntk-batches", "100000"], "every Jacobian batch needs at least one sample"),
    ([*SYN, "--algo", "ntk-dfl", "--ntk-subsample", "1000"], "every Jacobian batch needs at least one sample"),
    ([*SYN, "--algo", "ntk-dfl", "--test-samples", "1"], "validation and test halves and needs at least 2"),
    ([*SYN, "--algo", "ntk-dfl", "--ntk-taus", "0"], "--ntk-taus needs positive integers"),
    ([*SYN, "--algo", "ntk-fl", "--ntk-taus", "100,1000000000"], "--ntk-taus takes at most 100,000 steps"),
    ([*SYN, "--algo", "ntk-dfl", "--ntk-taus", "200,100,200"], "--ntk-taus names each candidate once; given more"),
    ([*SYN, "--algo", "ntk-dfl", "--ntk-topk", "1.5"], "--ntk-topk must be in (0, 1]"),
    ([*SYN, "--algo", "ntk-dfl", "--ntk-quant-bits", "9"], "--ntk-quant-bits must be between"),
    ([*SYN, "--algo", "ntk-dfl", "--ntk-ode", "rk45"], "--ntk-ode must be one of"),
    ([*SYN, "--algo", "fedavg", "--clients-per-round", "50", "--peers", "10"], "exceeds the 10 clients"),
    ([*SYN, "--algo", "fedprox", "--prox-mu", "-1"], "--prox-mu must be non-negative"),
    ([*SYN, "--algo", "dispfl", "--dispfl-density", "2"], "--dispfl-density must be in (0, 1]"),
    # graphs that cannot exist or would not connect
    ([*SYN, "--kappa", "-1"], "whole degree"),
    ([*SYN, "--topology", "erdos-renyi", "--kappa", "0"], "mean degree must be in"),
    ([*SYN, "--topology", "erdos-renyi", "--kappa", "0.01", "--peers", "10"], "almost never connected"),
    ([*SYN, "--topology", "erdos-renyi", "--kappa", "3", "--peers", "300"], "almost never connected"),
    ([*SYN, "--topology", "chain", "--peers", "1"], "at least 2 peers"),
    ([*SYN, "--topology", "full", "--peers", "1"], "at least 2 peers"),
    # options that do not apply here, names that do not exist, prefixes
    ([*SYN, "--pe", "4"], "unrecognized arguments: --pe"),
    ([*SYN, "-p", "4"], "unrecognized arguments"),
    ([*SYN, "--algo", "ntk-fl", "--ntk-batches", "2"], "does not apply to --algo ntk-fl"),
    ([*SYN, "--labels", "coarse"], "applies to --dataset cifar100 only"),
    ([*SYN, "--data-dir", "{tmp}"], "does not apply to --dataset synthetic"),
    ([*SYN, "--model", "resnet8"], "needs images"),
    ([*SYN, "--device", "gpu"], "unknown device"),
    ([*SYN, "--algo", ""], "unknown algorithm ''"),
    ([*SYN, "--mixing", "x"], "unknown mixing"),
    # config files
    (["--config", "{tmp}"], "cannot be read"),
    (["--config", "{tmp}/not-utf8.toml"], "is not valid TOML"),
    (["--config", "{tmp}/broken.toml"], "is not valid TOML"),
    (["--config", "{tmp}/lr-string.toml"], "--lr takes a finite number, not the string '0.1'"),
    (["--config", "{tmp}/save-edges-no.toml"], "--save-edges takes true or false, not 'no'"),
    (["--config", "{tmp}/peers-float.toml"], "--peers takes an integer, not 4.5"),
    (["--config", "{tmp}/rounds-bool.toml"], "--rounds takes an integer, not True"),
    (["--config", "{tmp}/kappa-nan.toml"], "--kappa takes a finite number"),
    (["--config", "{tmp}/table.toml"], "unknown setting(s): section"),
    (["--config", "{tmp}/algo-int.toml"], "--algo takes an algorithm's name, not 5"),
    (["--config", "{tmp}/hidden-text.toml"], "--hidden takes comma-separated layer widths"),
    (["--config", "{tmp}/taus-other-algo.toml"], "does not apply to --algo dfedavg"),
    (["--config", "{tmp}/resume-int.toml"], "--resume takes a run folder, not 3"),
    (["--config", "{tmp}/resume-table.toml"], "--resume takes a run folder, not {'a': 1}"),
    (["--resume", ""], "--resume takes a run folder, not ''"),
    (["--config", ""], "--config is empty: give a TOML file or a preset's name"),
    (["--config", "a" * 300], "--config " + "a" * 60 + "... (300 characters): File name too long"),
    (["--config", "{tmp}/quant-float.toml"], "--gossip-quant-bits takes an integer, not 4.0"),
    # graphs of the user's: files and functions
    ([*SYN, "--peers", "4", "--topology-file", "{tmp}/superscript.txt"], "not peers: '²'"),
    ([*SYN, "--peers", "4", "--topology-file", "{tmp}/dashes.txt"], "not peers: '--0'"),
    ([*SYN, "--peers", "4", "--topology-file", "{tmp}/loop1.txt"], "loop1.txt cannot be found (Symlink loop"),
    (
        [*SYN, "--peers", "4", "--topology", "tests.graph_functions:no_arguments"],
        "no_arguments() cannot be called as no_arguments(peers, round, seed)",
    ),
    # data folders
    (["--dataset", "mnist", "--data-dir", "{tmp}/absent"], "is not a folder"),
    (["--dataset", "mnist", "--data-dir", "{tmp}/not-utf8.toml"], "is not a folder"),
    (["--dataset", "mnist", "--data-dir", "{tmp}/sizes"], "differ from training images"),
    (["--dataset", "mnist", "--data-dir", "{tmp}/label-11"], "lie outside 0..9"),
    (["--dataset", "mnist", "--data-dir", "{tmp}/label-negative"], "lie outside 0..9"),
    (["--dataset", "mnist", "--data-dir", "{tmp}/counts"], "disagree"),
    (["--dataset", "mnist", "--data-dir", "{tmp}/not-idx"], "not an IDX file"),
    # output paths
    ([*SYN, "--out", "{tmp}/not-utf8.toml"], "is a file, not a folder"),
    ([*SYN, "--out", "{tmp}/not-utf8.toml/run"], "cannot be made"),
    ([*SYN, "--out", "/proc/p2pfl-run"], "cannot be made"),
    ([*SYN, "--out", ""], "must name a folder"),
    ([*SYN, "--out", "{tmp}/finished"], "already holds files"),
]
FILES = {
    "not-utf8.toml": b"\xff\xfe\x00 = 1",
    "broken.toml": b"lr = [0.1",
    "lr-string.toml": b'lr = "0.1"',
    "save-edges-no.toml": b'save_edges = "no"',
    "peers-float.toml": b"peers = 4.5",
    "rounds-bool.toml": b"rounds = true",
    "kappa-nan.toml": b"kappa = nan",
    "table.toml": b"[section]\na = 1",
    "algo-int.toml": b"algo = 5",
    "resume-int.toml": b"resume = 3",
    "resume-table.toml": b"resume = {a = 1}",
    "hidden-text.toml": b'hidden = "abc"',
    "taus-other-algo.toml": b"ntk_taus = [100]",
    "finished/metrics.jsonl": b"{}",
    "quant-float.toml": b"gossip_quant_bits = 4.0",
    "superscript.txt": "0 1\n1 2\n2 3\n3 \u00b2\n".encode(),
    "dashes.txt": b"0 1\n1 2\n2 3\n3 --0\n",
}


def _hostile_tree(root):
    """The files the HOSTILE table names: config files, an unfinished run folder and bad MNIST folders."""
    import numpy as np

    from tests.conftest import write_idx

    for name, raw in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(raw)
    (root / "loop1.txt").symlink_to(root / "loop2.txt")
    (root / "loop2.txt").symlink_to(root / "loop1.txt")
    rng = np.random.default_rng(0)

    def mnist(folder, test_shape=(28, 28), label_at=None, label_dtype=np.uint8, test_labels=20):
        folder.mkdir()
        for split, n, shape in (("train", 60, (28, 28)), ("t10k", 20, test_shape)):
            labels = (np.arange(n if split == "train" else test_labels) % 10).astype(label_dtype)
            if label_at is not None and split == "train":
                labels[3] = label_at
            write_idx(folder / f"{split}-images-idx3-ubyte", rng.integers(0, 255, (n, *shape)).astype(np.uint8))
            write_idx(folder / f"{split}-labels-idx1-ubyte", labels)

    mnist(root / "sizes", test_shape=(32, 32))
    mnist(root / "label-11", label_at=11)
    mnist(root / "label-negative", label_at=-1, label_dtype=np.int8)
    mnist(root / "counts", test_labels=19)
    mnist(root / "not-idx")
    (root / "not-idx" / "train-images-idx3-ubyte.gz").unlink()
    (root / "not-idx" / "train-images-idx3-ubyte").write_bytes(b"PK\x03\x04 a zip file")


@pytest.mark.parametrize("argv,needle", BAD + HOSTILE, ids=[" ".join(a) for a, _ in BAD + HOSTILE])
def test_bad_input_is_one_line_and_exit_2(argv, needle, capsys, tmp_path):
    """Exit 2 with one line naming the problem, no traceback, and nothing written: no run folder, and
    the files it was given unchanged."""
    _hostile_tree(tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    out = [] if "--out" in argv else ["--out", str(tmp_path / "run")]
    code = main([*argv, *out, "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1, err
    assert err[0].startswith("p2pfl: error:") and needle in err[0], err[0]
    assert not (tmp_path / "run").exists()
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


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


@pytest.mark.subprocess
def test_subprocess_prints_no_traceback():
    result = run_cli("--topology", "regular", "--kappa", "3", "--peers", "5")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr


def test_an_existing_run_folder_is_never_clobbered(tmp_path, capsys):
    """A second run into a finished run's folder is refused before any work; --overwrite replaces it;
    config.toml carries neither out nor overwrite, so --config on it starts a new folder."""
    run = tmp_path / "run"
    args = [
        "--dataset",
        "synthetic",
        "--peers",
        "4",
        "--kappa",
        "2",
        "--rounds",
        "1",
        "--local-epochs",
        "1",
        "--no-progress",
        "--out",
        str(run),
    ]
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


def test_help_names_what_a_value_looks_like_and_the_command_as_typed(monkeypatch):
    from p2pfl.runner.configure import build_parser

    text = build_parser().format_help()
    assert "--samples-per-peer N" in text and "--clients-per-round" not in text  # dfedavg's flags only
    assert "--drop-peers P" in text and "--lr X" in text and "--data-dir DIR" in text
    assert build_parser("fedavg").format_help().count("--clients-per-round N") == 2  # usage and its line
    monkeypatch.setattr("sys.argv", ["/venv/bin/p2pfl-run"])
    assert build_parser().format_usage().startswith("usage: p2pfl-run ")


def test_help_of_a_named_algorithm_states_the_defaults_it_sets(capsys):
    """--algo tct --help: TCT's lr 0.01, batch 64 and its 200 rounds (stages), not "the algorithm's"; plain
    --help, which names no algorithm, says that each sets its own."""
    import re

    from p2pfl.runner.configure import parse_config

    def help_of(*argv) -> str:
        with pytest.raises(SystemExit):
            parse_config([*argv, "--help"])
        return " ".join(capsys.readouterr().out.split())  # argparse wraps lines

    tct = help_of("--algo", "tct")
    assert "learning rate (default 0.01)" in tct and "local minibatch size (default 64)" in tct
    assert re.search(r"--rounds N communication rounds \(default 200\)", tct)
    assert "learning rate (default 0.1)" in help_of("--algo", "fedavg")
    assert "learning rate (default the algorithm's)" in help_of()


def test_a_quoted_number_in_toml_is_named_as_a_string(tmp_path, capsys):
    for text, said in (
        ('lr = "0.1"', "not the string '0.1': in a TOML file write it without quotes"),
        ('static = "true"', "not the string 'true'"),
        ('lr = "abc"', "--lr takes a finite number, not 'abc'"),
    ):
        (tmp_path / "c.toml").write_text(text + "\n")
        assert main(["--config", str(tmp_path / "c.toml")]) == 2
        assert said in capsys.readouterr().err


def test_a_config_file_saved_with_a_byte_order_mark_reads_as_without(tmp_path):
    """Some editors begin a UTF-8 file with a BOM; it read as "Invalid statement (line 1, column 1)"."""
    from p2pfl.runner.configure import load_toml

    (tmp_path / "c.toml").write_bytes(b'\xef\xbb\xbfalgo = "fedavg"\nlr = 0.05\n')
    assert load_toml(str(tmp_path / "c.toml")) == {"algo": "fedavg", "lr": 0.05}


def test_the_docs_tool_has_help_and_refuses_a_missing_file(capsys):
    from p2pfl.docs import main as docs_main

    with pytest.raises(SystemExit) as done:
        docs_main(["--help"])
    assert done.value.code == 0 and "usage: python -m p2pfl.docs" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        docs_main(["no/such.md"])
    assert done.value.code == 2 and "no such file: no/such.md" in capsys.readouterr().err


def test_every_toml_key_and_simulate_argument_is_its_flags_name(tmp_path):
    """--no-batch is batch = false in TOML and batch=False in simulate(), like every other flag; a run
    folder written when the key was 'batched' still resumes."""
    from p2pfl.runner.configure import _stored_config, make_config, parse_config

    (tmp_path / "c.toml").write_text("batch = false\n")
    assert parse_config(["--config", str(tmp_path / "c.toml")]).batch is False
    assert parse_config(["--no-batch"]).batch is False and make_config({"batch": False}).batch is False
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "config.toml").write_text('algo = "dfedavg"\nbatched = false\n')
    assert _stored_config(str(tmp_path / "old")) == {"algo": "dfedavg", "batch": False}


def test_the_refusal_quoted_in_the_docs_is_the_one_printed(capsys):
    from tests.conftest import ROOT

    assert main(["--peers", "abc"]) == 2
    said = capsys.readouterr().err.strip()
    assert f"    {said}\n" in (ROOT / "docs" / "cli.md").read_text()


def test_the_tiers_tell_a_launch_from_a_librarys_helper_program():
    import sys

    from tests.conftest import _launch_kind

    assert _launch_kind(["/x/bin/mpirun", "-n", "3", sys.executable, "-m", "p2pfl.run"]) == "mpi"
    assert _launch_kind(["bash", "launch/mpirun.sh", "3"]) == "mpi"
    assert _launch_kind([sys.executable, "-m", "analysis"]) == "subprocess"
    assert _launch_kind(["p2pfl-run", "--peers", "4"]) == "subprocess"
    assert _launch_kind(["gcc", "-v"]) is None and _launch_kind("ldconfig -p") is None


def test_a_batch_size_no_machine_holds_is_one_line_before_anything_is_allocated(tmp_path, capsys):
    """Hostile case of issue 50: --batch-size 1000000000 tried to allocate 32 GB of minibatch plans."""
    out = tmp_path / "run"
    args = ["--dataset", "synthetic", "--peers", "4", "--kappa", "2", "--rounds", "1", "--no-progress"]
    code = main([*args, "--batch-size", "1000000000", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "--batch-size 1,000,000,000 for 4 peers needs about" in err, err
    assert err.count("\n") == 1 and not out.exists()  # the folder the refused run made is gone again
