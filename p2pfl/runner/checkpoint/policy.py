"""What a run saves and when: its state (its peers' rows, the algorithm's declared state, the server's, the
metrics rows) captured in memory after every round; after every round the ranks agree whether a
checkpoint is due (--checkpoint-every, or CHECKPOINT_SECONDS since the last) or a stop was asked for
(Ctrl-C); a stop at once (p2pfl.stopping) saves the last round every rank holds in memory."""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import torch

from p2pfl.errors import DivergenceError, Interrupted
from p2pfl.runner.checkpoint.files import write
from p2pfl.settings.run_config import CHECKPOINT_SECONDS, FIELDS, RESULT_NEUTRAL, RunConfig


def result_settings(cfg: RunConfig) -> dict[str, Any]:
    """What a run's numbers depend on, its algorithm's settings included, but its length (a run may be
    lengthened): kept in its checkpoints, so that a checkpoint of another run is told apart."""
    out = {k: getattr(cfg, k) for k in FIELDS if k not in RESULT_NEUTRAL and k != "rounds"}
    if dataclasses.is_dataclass(cfg.settings):
        out.update({f"{k} (its own)": v for k, v in dataclasses.asdict(cfg.settings).items()})
    return out


def state_names(algorithm, kind: str) -> list[str]:
    """The algorithm's declared state of a kind: "peer", "server" or "pooled" (Algorithm.state)."""
    return [name for name, k in algorithm.state.items() if k == kind]


def _get(obj, dotted: str):
    for name in dotted.split("."):
        obj = getattr(obj, name)
    return obj


def _cpu(value):
    return value.detach().cpu() if isinstance(value, torch.Tensor) else value


def capture(ctx, algorithm, rows: list[dict], rounds_done: int, copy: bool = True) -> dict:
    """This rank's part of a checkpoint after round `rounds_done` (1-based), on the CPU. With copy, its
    own copies: the next round changes the run's tensors in place, and a stop by SIGTERM writes the
    last completed round's capture (run.py keeps one in memory)."""
    take = (lambda v: v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor) else v) if copy else _cpu
    state = {
        "round": rounds_done,
        "peers": list(ctx.peers),
        "flat": take(ctx.flat),
        "peer_state": {name: take(_get(algorithm, name)) for name in state_names(algorithm, "peer")},
        "pooled": {name: list(_get(algorithm, name)) for name in state_names(algorithm, "pooled")},
    }
    if ctx.transport.rank == 0:
        state["server"] = {name: take(_get(algorithm, name)) for name in state_names(algorithm, "server")}
        state["global_weights"] = take(ctx.global_weights)
        state["rows"] = list(rows)
        state["settings"] = result_settings(ctx.cfg)  # whose checkpoint this is (a copied one is refused)
    return state


def save(ctx, algorithm, rows: list[dict], rounds_done: int, run_dir: Path) -> None:
    """Called on every rank after round `rounds_done` (1-based) is complete and its metrics recorded."""
    state = capture(ctx, algorithm, rows, rounds_done, copy=False)
    write(state, run_dir, ctx.transport)


def resume_hint(run_dir: Path | None, saved: int) -> str:
    if run_dir is None:
        return "the run wrote no folder (out=None), so there is nothing to resume"
    if not saved:
        return f"no checkpoint was written; run folder: {run_dir}"
    return f"checkpoint after round {saved}; continue with: python -m p2pfl.run --resume {run_dir}"


# Seconds a stop by signal waits for the other ranks while it saves: every rank signalled leaves its
# compute within a step (p2pfl.stopping), so they meet within a second or two; a dead rank is what the
# wait gives up on. The whole stop stays within 10 s. launch/slurm.sh asks for the signal 90 s before the limit.
EMERGENCY_TIMEOUT = 5.0


class Checkpoints:
    """A run's checkpoints: written when due or asked for, after a round whose state is resumable; the
    last completed rounds held in memory for a stop at once (write=False: none of either)."""

    def __init__(self, ctx, algorithm, run_dir: Path | None, write: bool, saved: int):
        self.ctx, self.algorithm, self.run_dir, self.write = ctx, algorithm, run_dir, write
        self.saved, self.last_save = saved, time.monotonic()
        self.held: list[dict] = []  # in-memory captures of the last completed rounds: what a stop at once saves

    def after_round(self, k: int, rows: list[dict], resumable: bool, stop_requested: bool, drift: str | None) -> None:
        """After round k's row: every rank takes the same turn (a checkpoint, a stop: Interrupted; rank 0's
        drift, the line of peers drifting apart: DivergenceError)."""
        ctx, done = self.ctx, k + 1
        due = checkpoint_due(ctx.cfg.checkpoint_every, done, time.monotonic() - self.last_save)
        stop, (due, drift) = ctx.transport.agree(stop_requested, (due, drift))
        if drift:
            raise DivergenceError(drift)
        if (due or stop) and self.write and resumable:
            save(ctx, self.algorithm, rows, done, self.run_dir)
            self.saved, self.last_save = done, time.monotonic()
        if stop:
            raise Interrupted(f"stopped after round {done}; {resume_hint(self.run_dir, self.saved)}")

    def hold(self, k: int, rows: list[dict], resumable: bool) -> None:
        """Capture round k in memory for a stop at once, as soon as its row is recorded and before the row is
        written anywhere: a round whose row a user sees is one a stop saves."""
        done = k + 1
        if self.write and resumable and done > self.saved:
            # ranks may be a collective apart when a signal lands: under MPI keep two rounds
            kept = self.held[-1:] if self.ctx.transport.size > 1 else []
            self.held = [*kept, capture(self.ctx, self.algorithm, rows, done)]

    def save_held(self) -> int:
        """After a stop at once: write the newest round every rank holds a capture of, if it is newer
        than the last checkpoint; returns the round the run folder now has a checkpoint of. Under MPI the
        ranks first agree on that round, waiting a few seconds at most: a rank that died (mpirun sends
        SIGTERM to the others then) leaves the previous checkpoint as it was."""
        transport, timeout = self.ctx.transport, self.ctx.transport.timeout
        transport.timeout = min(timeout, EMERGENCY_TIMEOUT)
        try:
            with transport.emergency():  # apart from a collective the signal cut short
                rounds = transport.gather([state["round"] for state in self.held])
                common = transport.bcast(
                    max(set.intersection(*map(set, rounds)), default=0) if rounds is not None else None
                )
                if common <= self.saved:
                    return self.saved
                write(next(s for s in self.held if s["round"] == common), self.run_dir, transport)
                transport.barrier()  # latest.json is written before any rank exits (mpirun ends the job at the first)
                self.saved = common
                return common
        except Exception as exc:  # noqa: BLE001 - a dead rank, a full disk, a collective cut by the signal
            if transport.rank == 0:
                print(f"p2pfl: the last rounds could not be saved ({exc.__class__.__name__}: {exc})", file=sys.stderr)
            return self.saved
        finally:
            transport.timeout = timeout


def checkpoint_due(every: int | None, rounds_done: int, since_last: float) -> bool:
    if every is None:
        return since_last >= CHECKPOINT_SECONDS
    return every > 0 and rounds_done % every == 0
