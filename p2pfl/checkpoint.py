"""Checkpoints: everything the next round depends on, so that --resume continues a run exactly.

Each rank writes one file with its peers' rows (weights and the algorithm's per-peer state) and rank 0
adds the server's state and the metrics rows so far. Files are written to a temporary name and renamed,
in two alternating slots, and `latest.json` names the last complete slot only after every rank has
written: a crash mid-write leaves the previous checkpoint intact. Loading takes plain tensors, lists
and numbers (torch.load with weights_only=True, no unpickled objects) and picks rows by peer id, so a
run resumes on any number of ranks. Random draws are keyed by (seed, purpose, round, peer)
(p2pfl.seeding), so no generator state needs saving.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from p2pfl.errors import UserError

FOLDER = "checkpoint"
LATEST = "latest.json"


def _get(obj, dotted: str):
    for name in dotted.split("."):
        obj = getattr(obj, name)
    return obj


def _set(obj, dotted: str, value) -> None:
    *path, last = dotted.split(".")
    for name in path:
        obj = getattr(obj, name)
    setattr(obj, last, value)


def _cpu(value):
    return value.detach().cpu() if isinstance(value, torch.Tensor) else value


def _file(folder: Path, slot: int, rank: int, ranks: int) -> Path:
    return folder / f"slot{slot}-rank{rank}-of{ranks}.pt"


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def save(ctx, algorithm, rows: list[dict], rounds_done: int, run_dir: Path) -> None:
    """Called on every rank after round `rounds_done` (1-based) is complete and its metrics recorded."""
    transport = ctx.transport
    folder = run_dir / FOLDER
    folder.mkdir(parents=True, exist_ok=True)  # every rank writes here: the run folder must be shared
    state = {"round": rounds_done, "peers": list(ctx.peers), "flat": _cpu(ctx.flat),
             "peer_state": {name: _cpu(_get(algorithm, name)) for name in algorithm.peer_state},
             "pooled": {name: list(_get(algorithm, name)) for name in algorithm.pooled_state}}
    if transport.rank == 0:
        state["server"] = {name: _cpu(_get(algorithm, name)) for name in algorithm.server_state}
        state["global_weights"] = _cpu(ctx.global_weights)
        state["rows"] = rows
    slot = rounds_done % 2
    _atomic_write(_file(folder, slot, transport.rank, transport.size), lambda p: torch.save(state, p))
    transport.barrier()  # every rank's file is complete before latest.json points at the slot
    if transport.rank == 0:
        meta = {"round": rounds_done, "slot": slot, "ranks": transport.size}
        _atomic_write(folder / LATEST, lambda p: p.write_text(json.dumps(meta)))
        keep = {_file(folder, s, r, transport.size).name for s in (0, 1) for r in range(transport.size)}
        for old in folder.glob("slot*.pt"):  # files of a layout this run has left
            if old.name not in keep:
                old.unlink()


def latest_round(run_dir: Path) -> int | None:
    path = Path(run_dir) / FOLDER / LATEST
    if not path.is_file():
        return None
    return int(json.loads(path.read_text())["round"])


def load(ctx, algorithm, run_dir: Path) -> tuple[int, list[dict]]:
    """Restore this rank's peers (and, on rank 0, the server) from the run's last checkpoint; returns
    (rounds done, metrics rows so far: rank 0 only)."""
    folder = Path(run_dir) / FOLDER
    try:
        meta = json.loads((folder / LATEST).read_text())
        parts = [torch.load(_file(folder, meta["slot"], r, meta["ranks"]), map_location="cpu", weights_only=True)
                 for r in range(meta["ranks"])]
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise UserError(f"--resume {run_dir}: its checkpoint cannot be read ({exc.__class__.__name__}: {exc})")
    if any(part["round"] != meta["round"] for part in parts):
        raise UserError(f"--resume {run_dir}: the checkpoint's files disagree on the round")
    where = {p: (part, i) for part in parts for i, p in enumerate(part["peers"])}

    def rows_of(key: str, name: str | None = None) -> torch.Tensor:
        picked = [(part[key][name] if name else part[key])[i] for part, i in (where[p] for p in ctx.peers)]
        return torch.stack(picked).to(ctx.device)

    ctx.flat = rows_of("flat")
    for name in algorithm.peer_state:
        _set(algorithm, name, rows_of("peer_state", name))
    for name in algorithm.pooled_state:  # lists whose order does not matter: all of them to rank 0
        _set(algorithm, name, [v for part in parts for v in part["pooled"][name]] if ctx.transport.rank == 0 else [])
    root = parts[0]
    if ctx.transport.rank == 0:
        for name, value in root["server"].items():
            _set(algorithm, name, value.to(ctx.device) if isinstance(value, torch.Tensor) else value)
        if root["global_weights"] is not None:
            ctx.global_weights = root["global_weights"].to(ctx.device)
    return meta["round"], root["rows"] if ctx.transport.rank == 0 else []
