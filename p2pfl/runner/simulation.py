"""A run on this rank: build it (data, partition, model, peers, topology, algorithm), loop over rounds,
write its folder (none with out=None). `simulate` is the Python entry; p2pfl.run is the CLI over it.

    import p2pfl
    result = p2pfl.simulate(algo="dfedavg", peers=10, rounds=5, dataset="synthetic", out=None)
    print(result.rows[-1]["test_acc"])
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from topologies import GraphError

from p2pfl.runner.checkpoint import files as checkpoint_files
from p2pfl.runner.checkpoint.restore import restore
from p2pfl.algorithms import REGISTRY
from p2pfl.algorithms.base import Algorithm
from p2pfl.runner.assemble import build, gpu_memory_in_one_line
from p2pfl.comm import mpi_world
from p2pfl.settings.run_config import RunConfig
from p2pfl import presets
from p2pfl.plugins import reference_to
from p2pfl.runner.configure import config_from_values, load_toml, resolve
from p2pfl.errors import UserError
from p2pfl.runner.loop import run_rounds
from p2pfl.runner.round_row import RoundMeasure
from p2pfl.measure.metrics import MetricsLog
from p2pfl.runner.run_folder import LOCKS, announce, device_facts, made_or_refused


def simulate(
    algo: str | type[Algorithm] | None = None,
    *,
    out: str | Path | None = None,
    config: str | Path | None = None,
    **settings: Any,
) -> Result:
    """Run a simulation and return its Result; the settings are the CLI's flags as keywords (underscores
    for hyphens: samples_per_peer=100), checked as the CLI checks them: a bad one raises ConfigError
    with the CLI's one-line message. algo: a name, or an Algorithm subclass. out: the run folder (None:
    write nothing). config: a TOML file the keywords override. Under mpirun every rank calls it and
    gets the same Result. It never exits the interpreter: a diverged, interrupted or failed run
    raises. resume=folder continues a run from its checkpoint, with its own settings. topology, model,
    dataset and gossip_codec also take the function (or class) itself, as a notebook defines it; the run
    folder's config.toml names it by module and name."""
    for name, path in (("config", config), ("out", out)):
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise UserError(f"{name} takes a path (a str or a Path), not {path!r}")
    values = load_toml(str(presets.find(config))) if config is not None else {}
    values.update({key.replace("-", "_"): value for key, value in settings.items()})
    for key in BY_VALUE:  # a function given by value: named by a reference that finds it again
        if callable(values.get(key)):
            values[key] = reference_to(values[key])
    if algo is not None:
        values["algo"] = algorithm_name(algo)
    if out is not None:
        values["out"] = str(out)
    rank, size, local_rank = mpi_world()
    writes = out is not None or bool(values.get("resume"))
    cfg = resolve(config_from_values(values, writes), size)
    return execute(cfg, rank, size, local_rank, write=writes, everywhere=True)


BY_VALUE = ("topology", "model", "dataset", "gossip_codec")  # settings that name the user's own code


def algorithm_name(algo: str | type[Algorithm]) -> str:
    """The registered name of an algorithm given by name or by class."""
    if isinstance(algo, type) and issubclass(algo, Algorithm):
        if not algo.__dict__.get("name") or REGISTRY.get(algo.name) is not algo:
            raise UserError(
                f"{algo.__qualname__} is not a registered algorithm: give the class a name "
                '(name = "my-algo") of its own'
            )
        return algo.name
    return algo


@dataclass
class Result:
    """What a run produced, on every rank: its metrics rows (metrics.jsonl's), the aggregated model's
    state dict (model.pt's; None where no round was evaluated), the algorithm's closing results
    (final.json's) and its run folder (None where it wrote none)."""

    rows: list[dict]
    model_state: dict[str, torch.Tensor] | None
    final: dict | None
    run_dir: Path | None
    config: RunConfig

    def series(self, key: str) -> list[tuple[int, float]]:
        """(round, value) of a metric over the rounds that have it, e.g. series("test_acc")."""
        return [(row["round"], row[key]) for row in self.rows if key in row]

    def __repr__(self) -> str:
        last = self.rows[-1] if self.rows else {}
        shown = {k: round(v, 4) for k, v in last.items() if k.startswith("test_") and isinstance(v, float)}
        return (
            f"Result({self.config.algo}, {len(self.rows)} rounds, last {shown}, "
            f"run_dir={str(self.run_dir) if self.run_dir else None})"
        )


def execute(
    cfg: RunConfig, rank: int, size: int, local_rank: int, write: bool = True, everywhere: bool = False
) -> Result:
    """A run on this rank (write=False: no run folder, no checkpoints). everywhere: every rank gets rank 0's Result (a broadcast of
    the rows and the model); else the other ranks' Result holds no rows (the CLI reads none)."""
    held = len(LOCKS)  # a run started inside another (a test's) releases its own lock only
    try:
        return _run(cfg, rank, size, local_rank, write or bool(cfg.resume), everywhere)
    except GraphError as exc:  # a graph the checks let through that could not be drawn (every rank alike)
        raise UserError(str(exc)) from None
    finally:
        while len(LOCKS) > held:
            LOCKS.pop().release()


def _run(cfg: RunConfig, rank: int, size: int, local_rank: int, write: bool, everywhere: bool) -> Result:
    if size > 1:  # oversubscribed ranks share the cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))
    taken = made_or_refused(cfg) if rank == 0 and write else None  # locked before any data is read
    if size == 1 and isinstance(taken, UserError):
        raise taken
    with gpu_memory_in_one_line(cfg, size, local_rank):  # running out of it anywhere: one line, no CUDA traceback
        ctx, algorithm = build(cfg, rank, size, local_rank)
        if ctx.stack.convolutional and ctx.device.type == "cpu":
            torch.set_num_threads(1)  # CPU conv kernels round differently with their thread count: one per rank
        run_dir = ctx.transport.bcast(taken)  # every rank stops with a refusal of the folder, or goes on with it
        if isinstance(run_dir, UserError):  # every rank stops with rank 0's refusal (a folder in use)
            raise run_dir
        devices = ctx.transport.gather(device_facts(ctx.device))  # the run header names every rank's device
        announce(ctx, algorithm, run_dir, write, devices)
        first, rows = 0, []
        if cfg.resume:  # read and checked before anything in the folder is written: a failed resume loses nothing
            snapshot = checkpoint_files.read(run_dir)
            restore(ctx, algorithm, snapshot, run_dir)
            first, rows = snapshot.round, snapshot.rows
            if rank == 0 and snapshot.note:
                print(f"p2pfl: {snapshot.note}", file=sys.stderr)
        log = MetricsLog(run_dir / "metrics.jsonl" if rank == 0 and run_dir is not None else None)
        log.restore(rows if rank == 0 else [])  # metrics.jsonl holds exactly the rounds done (none for a new run)
        final, state = run_rounds(ctx, algorithm, RoundMeasure(ctx, log), first, run_dir, write)
    rows, final, state = (log.rows, final, state) if rank == 0 else ([], None, None)
    if everywhere:
        rows, final, state = ctx.transport.bcast((rows, final, state) if rank == 0 else None)
    return Result(rows, state, final, run_dir, cfg)
