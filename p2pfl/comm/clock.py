"""The virtual clock: how long a round takes on a simulated network, from each peer's time for a local step
and each link's latency and bandwidth (issue 64's network and system model).

A round starts with every peer that takes part doing its local work: its local steps times its step time
(a straggler's --slow-factor times that). The round's exchanges then run in the order the algorithm makes
them: a message from src to dst leaves when src is done with what came before (its work and the earlier
exchanges), takes the link's latency plus its bytes (as the transport counts them, compressed where a codec
compresses) over the link's bandwidth, and dst is done with the exchange when its last message has arrived.
The round lasts until its last participant is done; lost messages and offline peers take no time.

Without --step-time the clock is the faults' (p2pfl.comm.faults): a round's local work takes one unit
whatever its steps (a straggler's --slow-factor units), messages take no time unless link flags are given,
and a round lasts min(--round-deadline, its last finish). Its numbers are the faults' sim_time unchanged.

Every draw (a peer's step time, a link's) is keyed by (seed, kind, peer or link), so every layout and a
resumed run see the same network.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from p2pfl.errors import UserError
from p2pfl.seeding import derive_seed, uniform_draw


def _normal(seed: int, kind: str, *indices: int) -> float:
    """A standard normal draw that depends only on its arguments (Box-Muller on two keyed uniforms)."""
    u1 = 1.0 - uniform_draw(seed, kind, 1, *indices)  # in (0, 1]
    u2 = uniform_draw(seed, kind, 2, *indices)
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


@dataclass(frozen=True)
class Network:
    """The run's network and system model. step_times: seconds per local step, one per peer (None: the
    faults' unit clock, a round's work 1 s); latency (s) and bandwidth (bytes/s, None: bytes take no
    time) of every link, spread by a log-normal factor of sigma spread per link where given. A graph edge's
    own latency and bandwidth attributes take precedence."""

    seed: int
    step_times: tuple[float, ...] | None = None
    latency: float = 0.0
    bandwidth: float | None = None
    spread: float = 0.0

    @lru_cache(maxsize=1 << 16)
    def _spread(self, a: int, b: int) -> float:
        return math.exp(self.spread * _normal(self.seed, "link-speed", min(a, b), max(a, b))) if self.spread else 1.0

    def message_time(self, src: int, dst: int, nbytes: int, edge: dict | None = None) -> float:
        """latency + bytes / bandwidth on the link src -> dst: its edge's attributes, else the run's spread
        by the link's factor (the same both ways; a slow link is slow in latency and bandwidth together)."""
        edge = edge or {}
        factor = self._spread(src, dst)
        latency = float(edge["latency"]) if "latency" in edge else self.latency * factor
        bandwidth = float(edge["bandwidth"]) if "bandwidth" in edge else None
        if bandwidth is None and self.bandwidth is not None:
            bandwidth = self.bandwidth / factor
        return latency + (nbytes / bandwidth if bandwidth is not None else 0.0)

    def work(self, peer: int, steps: int, straggling: float = 1.0) -> float:
        """A peer's local work in seconds: its steps times its step time (the unit clock: 1 a round), times
        a straggler's factor (the faults' --slow-factor)."""
        return straggling * (1.0 if self.step_times is None else steps * self.step_times[peer])

    def round_time(
        self, work: dict[int, float], exchanges: list[list[tuple[int, int, int]]], graph=None, deadline=None
    ) -> float:
        """The round's virtual seconds. work: each node taking part -> its local work's seconds (a server:
        0); exchanges: the round's exchanges in order, each the (src, dst, bytes) of the messages that
        arrived; graph: the round's (its edges' latency and bandwidth); deadline: the faults' cap."""
        done = dict(work)
        for messages in exchanges:
            before = dict(done)
            for src, dst, nbytes in messages:
                edge = graph.get_edge_data(src, dst) if graph is not None and graph.has_edge(src, dst) else None
                arrival = before.get(src, 0.0) + self.message_time(src, dst, nbytes, edge)
                if arrival > done.get(dst, 0.0):
                    done[dst] = arrival
        last = max(done.values(), default=0.0)
        return last if deadline is None else min(deadline, last)


def peer_step_times(
    seed: int, peers: int, step_time: float, spread: float = 0.0, slower: float = 0.0, slower_by: float = 1.0
) -> tuple[float, ...]:
    """Each peer's seconds per local step: step_time, times a log-normal factor of spread (its median 1)
    drawn per peer, times slower_by for round(slower * peers) peers drawn from the seed."""
    times = [
        step_time * math.exp(spread * _normal(seed, "step-time", p)) if spread else step_time for p in range(peers)
    ]
    count = round(slower * peers)
    if count:
        order = sorted(range(peers), key=lambda p: derive_seed(seed, "slower-peer", p))
        for p in order[:count]:
            times[p] *= slower_by
    return tuple(times)


def read_trace(path: str, flag: str, layout: str, parse) -> list[tuple[int, str, object]]:
    """The lines of a small CSV a flag names, as (line number, line, parse(its fields)): blank lines and #
    comments skipped, a first line that does not parse taken for a header; a line of other width or that
    does not parse is one line naming it (UserError)."""
    where = f"{flag} {path}"
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise UserError(f"{where}: {exc.strerror or exc}") from None
    width = len(layout.split(","))
    out: list[tuple[int, str, object]] = []
    for number, line in enumerate(lines, 1):
        words = [w.strip() for w in line.split("#", 1)[0].split(",")]
        if words == [""]:
            continue
        if len(words) != width:
            raise UserError(f"{where}: line {number} holds {len(words)} fields; a line reads '{layout}'")
        try:
            out.append((number, line, parse(words)))
        except ValueError:
            if not out and number == 1:
                continue  # a header
            raise UserError(f"{where}: line {number}: {line.strip()!r} is not '{layout}'") from None
    return out


def read_step_times(path: str, peers: int) -> tuple[float, ...]:
    """Every peer's seconds per local step from a CSV of 'peer,seconds' lines (a header line may lead; #
    starts a comment), checked where it enters: each peer once, each time a positive finite number."""
    where = f"--step-time-file {path}"
    times: dict[int, float] = {}
    for number, _, (peer, seconds) in read_trace(
        path, "--step-time-file", "peer,seconds", lambda w: (int(w[0]), float(w[1]))
    ):
        if not 0 <= peer < peers:
            raise UserError(f"{where}: line {number}: peer {peer} is not one of the run's peers 0..{peers - 1}")
        if not (math.isfinite(seconds) and seconds > 0):
            raise UserError(f"{where}: line {number}: peer {peer}'s step time must be a positive number, got {seconds}")
        if peer in times:
            raise UserError(f"{where}: line {number}: peer {peer} is given twice")
        times[peer] = seconds
    missing = [p for p in range(peers) if p not in times]
    if missing:
        raise UserError(f"{where}: no step time for peer{'s' if len(missing) > 1 else ''} {missing[:10]}")
    return tuple(times[p] for p in range(peers))
