"""Peers that drift apart: a run whose consensus distance grows round after round by orders of magnitude
is diverging even while its weights stay finite (CHOCO-SGD with a consensus step too large for its codec
ran hundreds of rounds at chance, the distance at 1e8). Told apart from a healthy run's rise: consensus
from a shared start grows at most like t^2 until mixing balances it (10^4 rounds on a 300-peer ring), 4x
over rounds 50 to 100; a diverging run grows geometrically (37x there in that CHOCO run)."""

from __future__ import annotations

WINDOW = 50  # rounds looked at, after the first WINDOW (the rise from a shared start)
GROWTH = 10.0  # how many times its first value the distance reaches at the window's end
RISING = 0.9  # the share of the window's rounds in which it rose


def drifting(rows: list[dict]) -> tuple[int, float, int, float] | None:
    """(first round, its distance, last round, its distance) of a window over which the consensus
    distance grew GROWTH times or more, rising in RISING of its rounds; None while it does not."""
    if len(rows) <= 2 * WINDOW:
        return None
    window = [(row["round"], row.get("consensus_distance")) for row in rows[-WINDOW - 1 :]]  # the last rows only
    if any(value is None for _, value in window):  # a star's rows, or a stage without a graph
        return None
    (first, start), (last, end) = window[0], window[-1]
    rises = sum(b > a for (_, a), (_, b) in zip(window, window[1:]))
    if start > 0 and end >= GROWTH * start and rises >= RISING * WINDOW:
        return first, start, last, end
    return None


def drift_line(rows: list[dict], step: str) -> str | None:
    """The line that stops a run whose peers drift apart, naming the rounds and the setting to lower."""
    window = drifting(rows)
    if window is None:
        return None
    first, start, last, end = window
    return (
        f"round {last}: the peers drift apart: their consensus distance grew from {start:.3g} (round {first}) to "
        f"{end:.3g}, rising in most rounds; lower {step}, or add --no-drift-stop to run on"
    )
