"""Checkpoints: everything the next round depends on, so that --resume continues a run exactly; when a
run writes one and how it stops.

Each rank writes one file with its peers' rows (weights and the algorithm's per-peer state) and rank 0
adds the server's state and the metrics rows so far. Files are written to a temporary name and renamed,
in two alternating slots, and `latest.json` names the last complete slot only after every rank has
written: a crash mid-write leaves the previous checkpoint intact, and a damaged newest slot falls back
to the other. Loading takes plain tensors, lists
and numbers (torch.load with weights_only=True, no unpickled objects) and picks rows by peer id, so a
run resumes on any number of ranks. Random draws are keyed by (seed, purpose, round, peer)
(p2pfl.seeding), so no generator state needs saving.

After every round the ranks agree whether a checkpoint is due (--checkpoint-every, or
CHECKPOINT_SECONDS since the last) or a stop was asked for (Ctrl-C), and a stop at once (SIGTERM, a
second Ctrl-C, another rank's) saves the last round every rank holds in memory (Checkpoints,
StopRequest).
"""

from __future__ import annotations

import _thread
import dataclasses
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from p2pfl import stopping
from p2pfl.config import CHECKPOINT_SECONDS, FIELDS, RESULT_NEUTRAL, RunConfig
from p2pfl.errors import Interrupted, UserError
from p2pfl.paths import read_regular

FOLDER = "checkpoint"
LATEST = "latest.json"


def result_settings(cfg: RunConfig) -> dict[str, Any]:
    """What a run's numbers depend on, its algorithm's settings included, but its length (a run may be
    lengthened): kept in its checkpoints, so that a checkpoint of another run is told apart."""
    out = {k: getattr(cfg, k) for k in FIELDS if k not in RESULT_NEUTRAL and k != "rounds"}
    if dataclasses.is_dataclass(cfg.settings):
        out.update({f"{k} (its own)": v for k, v in dataclasses.asdict(cfg.settings).items()})
    return out


def _get(obj, dotted: str):
    for name in dotted.split("."):
        obj = getattr(obj, name)
    return obj


def _set(obj, dotted: str, value) -> None:
    *path, last = dotted.split(".")
    for name in path:
        obj = getattr(obj, name)
    setattr(obj, last, value)


def _differences(stored: dict, now: dict) -> list[str]:
    """'seed 1, not 0' for each setting a checkpoint was written with that the run now has otherwise."""
    return [
        f"{k} {stored.get(k)!r}, not {now.get(k)!r}"
        for k in sorted(set(stored) | set(now))
        if stored.get(k) != now.get(k)
    ]


def _names(algorithm, kind: str) -> list[str]:
    """The algorithm's declared state of a kind: "peer", "server" or "pooled" (Algorithm.state)."""
    return [name for name, k in algorithm.state.items() if k == kind]


def _cpu(value):
    return value.detach().cpu() if isinstance(value, torch.Tensor) else value


def _file(folder: Path, slot: int, rank: int, ranks: int) -> Path:
    return folder / f"slot{slot}-rank{rank}-of{ranks}.pt"


def atomic_write(path: Path, write) -> None:
    """write(a temporary name), then rename: a write that fails (a full disk, a read-only folder) leaves
    the file as it was and raises OSError naming it (torch.save reports a failed write as RuntimeError)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        if tmp.is_symlink():  # written through, a planted link would put the file elsewhere: drop the link
            tmp.unlink()
        write(tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "the write failed"
        raise OSError(getattr(exc, "errno", None) or 5, reason, str(path)) from exc


def capture(ctx, algorithm, rows: list[dict], rounds_done: int, copy: bool = True) -> dict:
    """This rank's part of a checkpoint after round `rounds_done` (1-based), on the CPU. With copy, its
    own copies: the next round changes the run's tensors in place, and a stop by SIGTERM writes the
    last completed round's capture (run.py keeps one in memory)."""
    take = (lambda v: v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor) else v) if copy else _cpu
    state = {
        "round": rounds_done,
        "peers": list(ctx.peers),
        "flat": take(ctx.flat),
        "peer_state": {name: take(_get(algorithm, name)) for name in _names(algorithm, "peer")},
        "pooled": {name: list(_get(algorithm, name)) for name in _names(algorithm, "pooled")},
    }
    if ctx.transport.rank == 0:
        state["server"] = {name: take(_get(algorithm, name)) for name in _names(algorithm, "server")}
        state["global_weights"] = take(ctx.global_weights)
        state["rows"] = list(rows)
        state["settings"] = result_settings(ctx.cfg)  # whose checkpoint this is (a copied one is refused)
    return state


def save(ctx, algorithm, rows: list[dict], rounds_done: int, run_dir: Path) -> None:
    """Called on every rank after round `rounds_done` (1-based) is complete and its metrics recorded."""
    write(capture(ctx, algorithm, rows, rounds_done, copy=False), run_dir, ctx.transport)


def write(state: dict, run_dir: Path, transport) -> None:
    """Every rank's captured state into the slot latest.json does not name, then latest.json (rank 0)."""
    folder = run_dir / FOLDER
    folder.mkdir(parents=True, exist_ok=True)  # every rank writes here: the run folder must be shared
    slot = _next_slot(folder)
    atomic_write(_file(folder, slot, transport.rank, transport.size), lambda p: torch.save(state, p))
    transport.barrier()  # every rank's file is complete before latest.json points at the slot
    if transport.rank == 0:
        meta = {"round": state["round"], "slot": slot, "ranks": transport.size}
        atomic_write(folder / LATEST, lambda p: p.write_text(json.dumps(meta)))
        keep = {_file(folder, s, r, transport.size).name for s in (0, 1) for r in range(transport.size)}
        for old in folder.glob("slot*.pt"):  # files of a layout this run has left
            if old.name not in keep:
                old.unlink()


def _next_slot(folder: Path) -> int:
    """The slot latest.json does not name: the newest checkpoint is never overwritten, so a damaged write
    leaves the previous one to fall back on. Every rank reads the same latest.json (rank 0 rewrites it
    after the barrier of a save, and the rounds between two saves synchronise the ranks)."""
    try:
        return 1 - _latest(folder)[1]
    except _Damaged:
        return 0


def has_checkpoint(run_dir: Path) -> bool:
    """Whether the run folder holds a checkpoint (readable or not: read() says which)."""
    folder = Path(run_dir) / FOLDER
    return (folder / LATEST).is_file() or any(folder.glob("slot*.pt"))


@dataclass
class Snapshot:
    """A checkpoint as read: the rounds done, every rank's file, and a line to print where the newest
    slot was damaged and the previous one is used."""

    round: int
    parts: list[dict]
    note: str | None = None

    @property
    def rows(self) -> list[dict]:
        return self.parts[0]["rows"]


class _Damaged(Exception):
    """A slot or latest.json that cannot be used; the message says what is wrong with it."""


def _latest(folder: Path) -> tuple[int, int, int]:
    """(round, slot, ranks) from latest.json."""
    try:
        meta = json.loads(read_regular(folder / LATEST).decode())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise _Damaged(f"{LATEST} cannot be read ({exc.__class__.__name__})")
    fields = meta if isinstance(meta, dict) else {}
    values = [fields.get(k) for k in ("round", "slot", "ranks")]
    if (
        not all(isinstance(v, int) and not isinstance(v, bool) for v in values)
        or values[1] not in (0, 1)
        or values[0] < 1
        or values[2] < 1
    ):
        raise _Damaged(f"{LATEST} does not name a round, a slot (0 or 1) and a rank count")
    return values[0], values[1], values[2]


def _read_slot(folder: Path, slot: int, ranks: int) -> list[dict]:
    """Every rank's file of a slot, checked for the shape save() gives them. torch.load with
    weights_only builds tensors and plain containers only: a file naming any other class is refused
    unrun."""
    parts = []
    for r in range(ranks):
        path = _file(folder, slot, r, ranks)
        try:
            if path.exists() and not path.is_file():  # a pipe or a device would block torch.load
                raise _Damaged(f"{path.name} is not a regular file")
            part = torch.load(path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise _Damaged(f"{path.name} is missing")
        except Exception as exc:  # noqa: BLE001 - truncated, random or foreign bytes: all mean damaged
            raise _Damaged(f"{path.name} cannot be read ({exc.__class__.__name__})")
        _check_part(part, path.name, root=r == 0)
        parts.append(part)
    if len({part["round"] for part in parts}) != 1:
        raise _Damaged("its files disagree on the round")
    return parts


def _check_part(part, name: str, root: bool) -> None:
    ok = (
        isinstance(part, dict)
        and isinstance(part.get("round"), int)
        and part["round"] >= 1
        and isinstance(part.get("peers"), list)
        and all(isinstance(p, int) for p in part["peers"])
        and isinstance(part.get("flat"), torch.Tensor)
        and part["flat"].dim() == 2
        and len(part["flat"]) == len(part["peers"])
        and isinstance(part.get("peer_state"), dict)
        and isinstance(part.get("pooled"), dict)
    )
    if ok and root:
        ok = (
            isinstance(part.get("server"), dict)
            and isinstance(part.get("rows"), list)
            and all(isinstance(row, dict) for row in part["rows"])
            and len(part["rows"]) == part["round"]
            and (part.get("global_weights") is None or isinstance(part.get("global_weights"), torch.Tensor))
        )
    if not ok:
        raise _Damaged(f"{name} does not hold a checkpoint")


def read(run_dir: Path) -> Snapshot:
    """The newest readable checkpoint of the run. save() alternates two slots, so where the newest is
    damaged the previous one is used (the note says so); where neither can be read, one UserError
    saying what is damaged. Reads only: nothing in the folder changes."""
    folder = Path(run_dir) / FOLDER
    problems, chosen, slot = [], None, None
    try:
        done, slot, ranks = _latest(folder)
    except _Damaged as exc:
        problems.append(str(exc))
    if slot is not None:
        try:
            chosen = (slot, _read_slot(folder, slot, ranks))
        except _Damaged as exc:
            problems.append(f"slot {slot} (round {done}): {exc}")
    if chosen is None:  # the other slot, or either where latest.json is unusable: by the files present
        options = []
        for other in (0, 1):
            if other == slot:
                continue
            for path in sorted(folder.glob(f"slot{other}-rank0-of*.pt")):
                count = path.name.rsplit("-of", 1)[1][: -len(".pt")]
                try:
                    options.append((other, _read_slot(folder, other, int(count))))
                except (_Damaged, ValueError) as exc:
                    problems.append(f"slot {other}: {exc}")
        if not options:
            raise UserError(
                f"--resume {run_dir}: no checkpoint can be read: {'; '.join(problems) or 'none was written'}"
            )
        chosen = max(options, key=lambda option: option[1][0]["round"])
    note = (
        None
        if not problems
        else (
            f"the newest checkpoint is damaged ({'; '.join(problems)}); resuming from "
            f"the previous one, after round {chosen[1][0]['round']}"
        )
    )
    return Snapshot(chosen[1][0]["round"], chosen[1], note)


def restore(ctx, algorithm, snapshot: Snapshot, run_dir: Path) -> None:
    """This rank's peers (and, on rank 0, the server) from the snapshot, after checking that it fits the
    run as configured (a config.toml edited since would not): nothing changes where it does not."""
    parts = snapshot.parts
    where = {p: (part, i) for part in parts for i, p in enumerate(part["peers"])}
    problem, stored = None, parts[0].get("settings")
    differ = [] if stored is None else _differences(stored, result_settings(ctx.cfg))
    if differ:
        raise UserError(
            f"--resume {run_dir}: the checkpoint does not fit the run's config.toml: it was written with "
            f"{'; '.join(differ[:4])}{' ...' if len(differ) > 4 else ''}; was config.toml edited, or the checkpoint "
            "copied from another run?"
        )
    if snapshot.round >= ctx.cfg.rounds:
        raise UserError(
            f"--resume {run_dir}: the checkpoint is after round {snapshot.round}, and config.toml's rounds is "
            f"{ctx.cfg.rounds}: nothing is left to run (was rounds lowered by hand? set it back in config.toml)"
        )
    if sorted(where) != list(range(ctx.cfg.peers)):
        problem = f"it holds {len(where)} peers, config.toml {ctx.cfg.peers}"
    elif any(part["flat"].shape[1] != ctx.stack.layout.size for part in parts):
        problem = (
            f"its models have {parts[0]['flat'].shape[1]:,} values, the configured model {ctx.stack.layout.size:,}"
        )
    elif any(
        set(part["peer_state"]) != set(_names(algorithm, "peer"))
        or set(part["pooled"]) != set(_names(algorithm, "pooled"))
        for part in parts
    ) or set(parts[0]["server"]) != set(_names(algorithm, "server")):
        problem = f"its state is not {ctx.cfg.algo}'s"
    if problem:
        raise UserError(
            f"--resume {run_dir}: the checkpoint does not fit the run's config.toml ({problem}); was "
            "config.toml edited?"
        )

    def rows_of(key: str, name: str | None = None) -> torch.Tensor:
        picked = [(part[key][name] if name else part[key])[i] for part, i in (where[p] for p in ctx.peers)]
        return torch.stack(picked).to(ctx.device)

    ctx.flat = rows_of("flat")
    for name in _names(algorithm, "peer"):
        _set(algorithm, name, rows_of("peer_state", name))
    for name in _names(algorithm, "pooled"):  # lists whose order does not matter: all of them to rank 0
        _set(algorithm, name, [v for part in parts for v in part["pooled"][name]] if ctx.transport.rank == 0 else [])
    root = parts[0]
    if ctx.transport.rank == 0:
        for name, value in root["server"].items():
            _set(algorithm, name, value.to(ctx.device) if isinstance(value, torch.Tensor) else value)
        if root["global_weights"] is not None:
            ctx.global_weights = root["global_weights"].to(ctx.device)


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


class StopRequest:
    """Ctrl-C asks the run to finish its round, write a checkpoint and stop (exit 130); a second Ctrl-C,
    or SIGTERM (a scheduler's stop or preemption; what mpirun sends the other ranks when one dies), stops
    at once and saves the last completed round from memory (exit 143 for SIGTERM)."""

    def __init__(self, rank: int, transport=None):
        stopping.LOOP_STARTED[0] = True
        self.requested, self.rank, self.by, self.now, self.remote = False, rank, "Ctrl-C", False, None
        self.code = 130  # the exit status of the stop: 128 + the signal's number (Ctrl-C: 130, SIGTERM: 143)
        self.transport = transport
        in_main_thread = threading.current_thread() is threading.main_thread()  # only it may set handlers
        self.previous = (
            {s: signal.signal(s, self.on_signal) for s in (signal.SIGINT, *stopping.AT_ONCE)} if in_main_thread else {}
        )
        self.watcher = stopping.SignalWatcher() if in_main_thread else None  # the long loops learn at once
        if in_main_thread and transport is not None:
            transport.watch_for_stops(self.on_remote_stop)

    def on_remote_stop(self, why: str) -> None:
        """Another rank stopped at once (its node preempted): this one does too, as if signalled, so that
        the ranks save the last round they all hold instead of waiting for the stopped one's messages."""
        if not self.now:
            self.remote = why
            stopping.NOW[0] = 1
            _thread.interrupt_main(signal.SIGUSR1)

    def on_signal(self, signum, frame) -> None:
        if self.now:  # already stopping at once: let it save what it holds
            return
        self.code = 143 if signum == signal.SIGUSR1 else 128 + signum  # SIGUSR1: a stop forwarded, as SIGTERM
        if signum == signal.SIGTERM:
            self.by = "SIGTERM (a scheduler's stop; under mpirun also when a rank died)"
        elif signum == signal.SIGHUP:
            self.by = "SIGHUP (its terminal closed)"
        elif signum == signal.SIGQUIT:
            self.by = "SIGQUIT"
        elif signum == signal.SIGUSR1 and self.remote:
            self.by = self.remote
        elif signum == signal.SIGUSR1:  # mpirun forwards it to every rank, where SIGTERM ends the job at once
            self.by = "SIGUSR1 (a stop forwarded by mpirun)"
        if self.requested or signum != signal.SIGINT:
            self.now = True
            stopping.NOW[0] = 1
            if self.transport is not None and not self.remote:
                self.transport.announce_stop(f"a stop of rank {self.rank}: {self.by}")
            raise KeyboardInterrupt
        self.requested = True
        if self.rank == 0:
            print(
                "\np2pfl: interrupted: finishing this round, then a checkpoint (Ctrl-C again stops at once)",
                file=sys.stderr,
            )

    def uninstall(self) -> None:
        """The handlers as they were; on the command line, after a stop, further signals are ignored
        instead: the process is about to print its one line and exit, and a second signal (an impatient
        Ctrl-C, a scheduler's repeated SIGTERM) must not end it without that line."""
        if self.transport is not None:
            self.transport.stop_watching()
        stopping_now = self.now or self.requested
        for s, handler in self.previous.items():
            signal.signal(s, signal.SIG_IGN if stopping_now and stopping.CLI[0] else handler)
        if self.watcher is not None:
            self.watcher.close()


class Checkpoints:
    """A run's checkpoints: written when due or asked for, after a round whose state is resumable; the
    last completed rounds held in memory for a stop at once (write=False: none of either)."""

    def __init__(self, ctx, algorithm, run_dir: Path | None, write: bool, saved: int):
        self.ctx, self.algorithm, self.run_dir, self.write = ctx, algorithm, run_dir, write
        self.saved, self.last_save = saved, time.monotonic()
        self.held: list[dict] = []  # in-memory captures of the last completed rounds: what a stop at once saves

    def after_round(self, k: int, rows: list[dict], resumable: bool, stop_requested: bool) -> None:
        """After round k's row: every rank takes the same turn (a checkpoint, a stop: Interrupted)."""
        ctx, done = self.ctx, k + 1
        due = checkpoint_due(ctx.cfg.checkpoint_every, done, time.monotonic() - self.last_save)
        stop, due = ctx.transport.agree(stop_requested, due)
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
