"""Restoring a run from its checkpoint: the snapshot checked against the run as configured (a
config.toml edited since, or a checkpoint copied from another run, is refused in one line), then each
rank's peers and rank 0's server state put back in place."""

from __future__ import annotations

from pathlib import Path

import torch

from p2pfl.errors import UserError
from p2pfl.runner import provenance
from p2pfl.runner.checkpoint.files import Snapshot
from p2pfl.runner.checkpoint.policy import result_settings, state_names


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
    changed = provenance.changed_input(provenance.recorded(run_dir / "config.toml"), ctx.cfg)
    if changed:
        raise UserError(
            f"--resume {run_dir}: {changed} changed since the run started (its rounds 1 to {snapshot.round} "
            "were run on the file's earlier content); put that content back, or start a new run"
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
        set(part["peer_state"]) != set(state_names(algorithm, "peer"))
        or set(part["pooled"]) != set(state_names(algorithm, "pooled"))
        for part in parts
    ) or set(parts[0]["server"]) != set(state_names(algorithm, "server")):
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
    for name in state_names(algorithm, "peer"):
        _set(algorithm, name, rows_of("peer_state", name))
    for name in state_names(algorithm, "pooled"):  # lists whose order does not matter: all of them to rank 0
        _set(algorithm, name, [v for part in parts for v in part["pooled"][name]] if ctx.transport.rank == 0 else [])
    root = parts[0]
    if ctx.transport.rank == 0:
        for name, value in root["server"].items():
            _set(algorithm, name, value.to(ctx.device) if isinstance(value, torch.Tensor) else value)
        if root["global_weights"] is not None:
            ctx.global_weights = root["global_weights"].to(ctx.device)
