"""docs/cli.md's metrics tables name every key that runs write to metrics.jsonl and final.json."""

import re
from pathlib import Path

import p2pfl
from p2pfl.measure.metrics import declared_keys

CLI = Path(__file__).resolve().parent.parent / "docs" / "cli.md"
TINY = dict(dataset="synthetic", peers=6, rounds=3, local_epochs=1, progress=False)
STAR = dict(TINY, topology="star", clients_per_round=3)


def documented(section: str) -> set[str]:
    """The keys in the first column of a table in section: `a_b_mean`, `_min` stands for a_b_min."""
    text = CLI.read_text()
    start = text.index(section)
    names = set()
    for line in text[start:].splitlines()[1:]:
        if line.startswith("#"):
            break
        if not line.startswith("| `"):
            continue
        full = None
        for name in re.findall(r"`([a-z_0-9]+)`", line.split("|")[1]):
            if name.startswith("_") and full:
                names.add(full.rsplit("_", 1)[0] + name)
            else:
                names.add(full := name)
    return names


def test_every_key_a_run_writes_is_in_the_tables():
    runs = [
        p2pfl.simulate("dfedavg", **TINY, kappa=2, drop_peers=0.3, slow_peers=0.3, client_test_samples=500),
        p2pfl.simulate("ntk-dfl", **TINY, kappa=2, samples_per_peer=20),
        p2pfl.simulate("cp-ntk-fl", **STAR, samples_per_peer=20, ntk_projection=16),
        p2pfl.simulate("dispfl", **TINY, kappa=2),
        p2pfl.simulate("cyclic", **STAR, cyclic_rounds=1),
        p2pfl.simulate(
            "fedavg-ft",
            **{**STAR, "dataset": "linear-rep", "clients_per_round": 0},
            samples_per_peer=30,
            ft_gradients="samples",
            ft_trials=1,
            ft_new_samples=10,
        ),
    ]  # fedavg-ft on linear-rep: a regression task
    rows = {key for run in runs for row in run.rows for key in row}
    finals = {key for run in runs for key in (run.final or {})}
    table = documented("### The metrics and their units")
    assert {"ntk_t_hist", "ntk_t", "offline", "phase", "client_personal_acc_mean", "client_acc_se"} <= rows
    assert rows - table == set(), "metrics.jsonl keys missing from docs/cli.md's table"
    assert rows - declared_keys() == set(), "metrics.jsonl keys no metric declares"
    assert {"tau_histogram", "client_val_acc"} <= finals
    assert finals - table == set(), "final.json keys missing from docs/cli.md's table"
