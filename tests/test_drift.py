"""Peers drifting apart stop a run as a diverging one (exit 3), told apart from a healthy run's rise."""

import math

import pytest

from p2pfl import testing
from p2pfl.measure import drift
from p2pfl.measure.drift import drifting


def _rows(distances):
    return [{"round": k + 1, "consensus_distance": d} for k, d in enumerate(distances)]


def test_geometric_growth_is_drift_and_a_shared_starts_rise_is_not():
    geometric = [0.9 * 1.075**k for k in range(200)]  # CHOCO-SGD, 1-bit QSGD, gamma 0.34: 7.5% a round
    first = next(k for k in range(1, 201) if drifting(_rows(geometric[:k])))
    assert first == 2 * drift.WINDOW + 1  # looked at from round 101 on, when rounds 51-101 grew 37 times
    quadratic = [(k + 1) ** 2 * 1e-6 for k in range(1000)]  # a slow ring's rise from a shared start
    rise_then_fall = [min(2.4 * (k + 1) ** 1.5, 70 * 0.97**k) for k in range(300)]
    cubic_then_flat = [min((k + 1) ** 3, 1e6) for k in range(400)]
    noisy = [1 + 0.1 * math.sin(7 * k) for k in range(300)]
    for healthy in (quadratic, rise_then_fall, cubic_then_flat, noisy):
        assert not any(drifting(_rows(healthy[:k])) for k in range(1, len(healthy) + 1))
    assert drifting([{"round": k + 1} for k in range(200)]) is None  # a star's rows: no distance


@pytest.mark.parametrize("flags,code", [([], 3), (["--no-drift-stop"], 0)])
def test_a_run_whose_peers_drift_apart_stops_with_exit_3_naming_the_round(tmp_path, monkeypatch, flags, code):
    """CHOCO-SGD with 1-bit QSGD at the paper's gamma ran on at chance; here the window is shortened."""
    monkeypatch.setattr(drift, "WINDOW", 4)
    monkeypatch.setattr(drift, "GROWTH", 1.2)
    args = ["--algo", "choco", "--gossip-quant-bits", "1", "--static", "--dataset", "synthetic", "--rounds", "12"]
    done = testing.run_in_process([*args, "--no-progress", "--eval-every", "6", "--out", str(tmp_path / "run"), *flags])
    assert done.returncode == code, done.stderr
    if code:
        assert "p2pfl: diverged: round 9: the peers drift apart: their consensus distance grew from" in done.stderr
        assert "(round 5)" in done.stderr and "lower --choco-gamma (the consensus step) or --lr" in done.stderr
