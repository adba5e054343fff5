"""A run on this rank: build it (data, partition, model, peers, topology, algorithm), loop over rounds,
write its folder (none with out=None). `simulate` is the Python entry; p2pfl.run is the CLI over it.

    import p2pfl
    result = p2pfl.simulate(algo="dfedavg", peers=10, rounds=5, dataset="synthetic", out=None)
    print(result.rows[-1]["test_acc"])
"""
from __future__ import annotations

import _thread
import json
import os
import shutil
import signal
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from topologies import GraphError, TopologySchedule
from topologies.drawing import draw_graph
from tqdm import tqdm

from p2pfl import checkpoint, stopping
from p2pfl.algorithms import REGISTRY, lookup
from p2pfl.algorithms.base import Algorithm, RunContext, check_round_result
from p2pfl.algorithms.server import clients_per_round
from p2pfl.comm import make_transport, mpi_world
from p2pfl.config import CHECKPOINT_SECONDS, RunConfig
from p2pfl.configure import (check_data_fit, check_model_memory, config_from_values, load_toml, resolve,
                             resolved_dict, write_toml)
from p2pfl.data import DataRequest, load_dataset, partition, read_partition_file, summary
from p2pfl.data.partition_file import through_origin
from p2pfl.errors import Interrupted, OutOfGPUMemory, UserError
from p2pfl.faults import Faults
from p2pfl.metrics import MetricsLog, run_model, synchronize
from p2pfl.models import PeerStack, build_model, count_parameters, initial_parameters
from p2pfl.ntk.precompile import loop_is_cached
from p2pfl.paths import FolderLock
from p2pfl.report import plot_metric, plot_partition
from p2pfl.seeding import graph_seeds
from p2pfl.tasks import TASKS
from p2pfl.threads import ranks_on_this_machine
from p2pfl.tracking import TensorBoardLog

started = False  # a round loop has begun in this process (StopRequest handles signals from then on)


def simulate(algo: str | type[Algorithm] | None = None, *, out: str | Path | None = None, config: str | Path | None = None,
             **settings: Any) -> Result:
    """Run a simulation and return its Result; the settings are the CLI's flags as keywords (underscores
    for hyphens: samples_per_peer=100), checked as the CLI checks them: a bad one raises ConfigError
    with the CLI's one-line message. algo: a name, or an Algorithm subclass. out: the run folder (None:
    write nothing). config: a TOML file the keywords override. Under mpirun every rank calls it and
    gets the same Result. It never exits the interpreter: a diverged, interrupted or failed run
    raises. resume=folder continues a run from its checkpoint, with its own settings."""
    for name, path in (("config", config), ("out", out)):
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise UserError(f"{name} takes a path (a str or a Path), not {path!r}")
    values = load_toml(str(config)) if config is not None else {}
    values.update({key.replace("-", "_"): value for key, value in settings.items()})
    if algo is not None:
        values["algo"] = algorithm_name(algo)
    if out is not None:
        values["out"] = str(out)
    rank, size, local_rank = mpi_world()
    writes = out is not None or bool(values.get("resume"))
    cfg = resolve(config_from_values(values, writes), size)
    return execute(cfg, rank, size, local_rank, write=writes, everywhere=True)


def algorithm_name(algo: str | type[Algorithm]) -> str:
    """The registered name of an algorithm given by name or by class."""
    if isinstance(algo, type) and issubclass(algo, Algorithm):
        if not algo.__dict__.get("name") or REGISTRY.get(algo.name) is not algo:
            raise UserError(f"{algo.__qualname__} is not a registered algorithm: give the class a name "
                            "(name = \"my-algo\") of its own")
        return algo.name
    return algo


def pick_device(choice: str, local_rank: int) -> torch.device:
    """The rank's device, decided once: auto is a GPU where there is one, else the CPU; auto and cuda
    spread the ranks of a machine over its GPUs by local rank; cuda:N is that GPU for every rank. A GPU
    becomes the process's current device, so that no library opens a context on GPU 0 beside it."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if choice == "auto":
        choice = "cuda" if gpus else "cpu"
    if choice == "cpu":
        return torch.device("cpu")
    if not gpus:
        raise UserError(f"--device {choice}: no CUDA device is available here (torch {torch.__version__} sees "
                        "none); use --device cpu or auto")
    index = local_rank % gpus if choice == "cuda" else int(choice.split(":", 1)[1])
    if index >= gpus:
        raise UserError(f"--device {choice}: this machine has {gpus} GPU{'s' if gpus > 1 else ''} "
                        f"(cuda:0{f' to cuda:{gpus - 1}' if gpus > 1 else ''})")
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    return device


def _ranks_per_gpu(choice: str) -> int:
    """The local ranks that share each GPU: all of them on a GPU named by its index, else the ranks
    spread over the GPUs by local rank (rounded up)."""
    local = ranks_on_this_machine() or 1
    return local if choice.startswith("cuda:") else -(-local // torch.cuda.device_count())


def _gpu_share(device: torch.device, choice: str, peers_here: int) -> tuple[str, int, int] | None:
    """(device, its bytes, the peers of the ranks that share it) for a GPU; None for the CPU."""
    if device.type != "cuda":
        return None
    return str(device), torch.cuda.get_device_properties(device).total_memory, peers_here * _ranks_per_gpu(choice)


_LOCKS: list[FolderLock] = []  # the run folder this process writes, locked until execute() ends


def _made_or_refused(cfg: RunConfig) -> Path | UserError:
    try:
        return make_run_dir(cfg)
    except UserError as exc:
        return exc


def make_run_dir(cfg: RunConfig) -> Path:
    if cfg.resume:
        _LOCKS.append(FolderLock(Path(cfg.resume)))
        return Path(cfg.resume)
    if cfg.out:
        path = Path(cfg.out)
    else:
        path = Path("runs") / f"{lookup(cfg.algo).name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
        suffix = 1
        while path.exists():
            path = path.with_name(f"{path.name.split('~')[0]}~{suffix}")
            suffix += 1
    path.mkdir(parents=True, exist_ok=True)
    _LOCKS.append(FolderLock(path))  # before anything in it changes: a run writing it now is not disturbed
    for product in [*RUN_FILES, *path.glob("*.png")]:  # --overwrite: the replaced run's files go, all of them
        product = path / product
        if product.is_dir() and not product.is_symlink():
            shutil.rmtree(product, ignore_errors=True)
        else:
            product.unlink(missing_ok=True)
    return path


# What a run writes into its folder besides its plots (*.png): an overwritten run's are removed first, so
# that one folder never holds two runs (an NTK-DFL run's final.json beside a DFedAvg run's metrics).
RUN_FILES = ("config.toml", "metrics.jsonl", "partition.json", "model.pt", "final.json", "edges.jsonl",
             "tct_linear.pt", "checkpoint", "tensorboard")


def build(cfg: RunConfig, rank: int, size: int, local_rank: int):
    """Everything a round needs, for this rank's peers."""
    device = pick_device(cfg.device, local_rank)
    cls = lookup(cfg.algo)
    data = load_dataset(cfg.dataset, DataRequest(cfg.data_dir, cfg.labels, cfg.peers, cfg.samples_per_peer, cfg.seed))
    if cfg.train_samples:
        data.keep_training_samples(cfg.train_samples, cfg.seed)
    check_data_fit(cfg, len(data.train_y), len(data.test_y))
    # a partition file's indices name samples of the training set as loaded: read before the algorithm
    # drops any (FedAvg-FT's held-out classes), then mapped to the samples kept
    written = read_partition_file(cfg.partition_file, cfg.peers, len(data.train_y)) if cfg.partition_file else None
    cls.prepare_data(data, cfg)
    transport = make_transport(cfg.peers, 1 if cls.centralized else 0, cfg.comm_timeout, device)
    faults = Faults(cfg.seed, cfg.peers, cfg.drop_peers, cfg.drop_links, cfg.slow_peers, cfg.slow_factor,
                    cfg.round_deadline)
    transport.faults = faults if faults.active else None
    peers = transport.placement.peers_of(transport.rank)
    with torch.device("meta"):  # counted before it is allocated
        n_params = count_parameters(build_model(cfg.model, data.input_shape, data.n_classes, cfg))
    check_model_memory(cfg, n_params, len(peers) * (ranks_on_this_machine() or 1), _gpu_share(device, cfg.device, len(peers)))
    if written is not None:
        shards = through_origin(written, data.train_origin, cfg.partition_file)
    else:
        shards = partition(data.train_y.numpy(), data.train_classes, cfg.peers, cfg.partition,
                           per_peer=cfg.samples_per_peer, alpha=cfg.alpha, classes=cfg.classes_per_peer,
                           style=cfg.dirichlet_style, classes_style=cfg.classes_style, groups=data.groups,
                           seed=cfg.seed)
    model = build_model(cfg.model, data.input_shape, data.n_classes, cfg)
    flat = initial_parameters(model, peers, cfg.seed, cfg.init, device)
    data.to(device)
    stack = PeerStack(model.to(device), cfg.batch, TASKS[data.task])
    if device.type == "cuda":  # the ranks that share a GPU share its free memory for their batches
        stack.memory_share /= _ranks_per_gpu(cfg.device)
    ctx = RunContext(cfg=cfg, transport=transport, data=data, shards=[torch.from_numpy(s) for s in shards],
                     schedule=TopologySchedule(cfg.topology, cfg.peers + cls.centralized, cfg.kappa,
                                               graph_seeds(cfg.seed), cfg.static),
                     stack=stack, peers=peers, flat=flat, device=device, faults=transport.faults)
    return ctx, cls(ctx)


def write_run_header(ctx, run_dir: Path, notes: list[str]) -> None:
    cfg = ctx.cfg
    write_toml(resolved_dict(cfg), run_dir / "config.toml",
               (f"model {cfg.model}: {count_parameters(ctx.stack.model):,} parameters, "
                f"{ctx.stack.layout.size - ctx.stack.layout.trainable:,} state values (batch norm statistics)", *notes))
    parts = summary([s.numpy() for s in ctx.shards], ctx.data.train_y.cpu().numpy(), ctx.data.n_classes)
    (run_dir / "partition.json").write_text(json.dumps(parts))
    if "classes" in parts[0]:
        with naming(run_dir / "partition.png"):
            plot_partition(parts, run_dir / "partition.png", ctx.data.class_names)
    if lookup(cfg.algo).centralized:
        title = (f"star: the server (node {cfg.peers}) and {cfg.peers} clients, {clients_per_round(cfg)} sampled "
                 f"each round")
    else:
        title = (f"{cfg.topology} ({'static' if cfg.static else 'round 1 of a new graph each round'}), "
                 f"{cfg.peers} peers")
    with naming(run_dir / "topology.png"):
        draw_graph(ctx.schedule.graph(0), run_dir / "topology.png", title)


@contextmanager
def naming(path: Path):
    """An OSError while writing path names it (a plotting library's may not)."""
    try:
        yield
    except OSError as exc:
        if exc.filename:
            raise
        raise OSError(exc.errno or 5, exc.strerror or str(exc), str(path)) from exc


def device_note(devices: list[str]) -> str:
    """Which device each rank got, for the run header: 'device cpu', or 'devices cuda:0 (ranks 0, 2), ...'."""
    ranks: dict[str, list[int]] = {}
    for r, d in enumerate(devices):
        ranks.setdefault(d, []).append(r)
    named = {d: f"{d} ({torch.cuda.get_device_name(torch.device(d))})" if d.startswith("cuda") else d for d in ranks}
    if len(ranks) == 1:
        return f"device {named[devices[0]]}" + (f" on all {len(devices)} ranks" if len(devices) > 1 else "")
    return "devices " + "; ".join(f"{named[d]} on rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}"
                                  for d, r in ranks.items())


def uses_ntk_loop(cfg: RunConfig) -> bool:
    """Whether the run's NTK evolutions go through the compiled (numba) integrator loop."""
    settings = cfg.settings
    return getattr(settings, "ntk_loss", None) == "ce" and getattr(settings, "ntk_ode", None) in ("split", "deflated")


def out_of_gpu_memory(cfg: RunConfig, size: int, device: str) -> OutOfGPUMemory:
    per_rank = -(-cfg.peers // size)
    if device.startswith("cuda"):
        device += f" ({torch.cuda.get_device_properties(torch.device(device)).total_memory / 2**30:.0f} GiB)"
    return OutOfGPUMemory(
        f"out of GPU memory on {device} with {per_rank} peers on a rank: use fewer peers per "
        f"rank (more ranks: mpirun -n, or fewer --peers), fewer samples (--samples-per-peer, --train-samples, "
        f"--test-samples), a smaller model (--model, --hidden), or --device cpu")


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
        return (f"Result({self.config.algo}, {len(self.rows)} rounds, last {shown}, "
                f"run_dir={str(self.run_dir) if self.run_dir else None})")


def execute(cfg: RunConfig, rank: int, size: int, local_rank: int, write: bool = True,
            everywhere: bool = False) -> Result:
    """A run on this rank (write=False: no run folder, no checkpoints); running out of GPU memory anywhere
    in it is one line, not a CUDA traceback. everywhere: every rank gets rank 0's Result (a broadcast of
    the rows and the model); else the other ranks' Result holds no rows (the CLI reads none)."""
    held = len(_LOCKS)  # a run started inside another (a test's) releases its own lock only
    try:
        return _run(cfg, rank, size, local_rank, write or bool(cfg.resume), everywhere)
    except torch.OutOfMemoryError:
        raise out_of_gpu_memory(cfg, size, str(pick_device(cfg.device, local_rank))) from None
    except GraphError as exc:  # a graph the checks let through that could not be drawn (every rank alike)
        raise UserError(str(exc)) from None
    finally:
        while len(_LOCKS) > held:
            _LOCKS.pop().release()


def _run(cfg: RunConfig, rank: int, size: int, local_rank: int, write: bool, everywhere: bool) -> Result:
    if size > 1:  # oversubscribed ranks share the cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))
    ctx, algorithm = build(cfg, rank, size, local_rank)
    if ctx.stack.convolutional and ctx.device.type == "cpu":
        torch.set_num_threads(1)  # CPU conv kernels round differently with their thread count: one per rank
    ctx.transport.barrier()  # every rank has checked --out before rank 0 makes the folder
    run_dir = ctx.transport.bcast(_made_or_refused(cfg) if rank == 0 and write else None)
    if isinstance(run_dir, UserError):  # every rank stops with rank 0's refusal (a folder in use)
        raise run_dir
    first, rows = 0, []
    if cfg.resume:  # read and checked before anything in the folder is written: a failed resume loses nothing
        snapshot = checkpoint.read(run_dir)
        checkpoint.restore(ctx, algorithm, snapshot, run_dir)
        first, rows = snapshot.round, snapshot.rows
        if rank == 0 and snapshot.note:
            print(f"p2pfl: {snapshot.note}", file=sys.stderr)
    saved = first
    devices = ctx.transport.gather(str(ctx.device))
    notes = algorithm.notes()
    if rank == 0:
        placed = device_note(devices)
        if write and not cfg.resume:  # a resumed run's header is the one it started with
            write_run_header(ctx, run_dir, [placed, *notes])
        for note in ([placed] if any(d != "cpu" for d in devices) else []) + notes:  # CPU runs: config.toml only
            print(f"p2pfl: {note}", file=sys.stderr)
        if uses_ntk_loop(cfg):
            if not loop_is_cached():
                print("p2pfl: compiling the NTK integrator loop (numba) for this machine: about 1-2 minutes, once "
                      "(make install does it ahead)", file=sys.stderr)
    log = MetricsLog(ctx, run_dir if rank == 0 else None, algorithm)
    log.restore(rows if rank == 0 else [])  # metrics.jsonl holds exactly the rounds done (none for a new run)
    if rank == 0 and cfg.resume and cfg.save_edges:  # a resume always has its folder
        (run_dir / "edges.jsonl").write_text("".join(_edges_line(ctx, k) for k in range(first)))
    board = TensorBoardLog(run_dir) if rank == 0 and cfg.tensorboard and write else None
    stop = StopRequest(rank, ctx.transport)
    bar = tqdm(range(first, cfg.rounds), desc=f"{cfg.algo} {cfg.peers} peers", disable=rank != 0 or not cfg.progress,
               unit="round", file=sys.stderr, initial=first, total=cfg.rounds)
    last_save, k = time.monotonic(), first
    round_start = time.perf_counter()  # each row's round_s runs from the previous row: the rows add up to the loop
    held: list[dict] = []  # in-memory captures of the last completed rounds: what a stop by SIGTERM saves
    shape = tuple(ctx.flat.shape)
    try:
        for k in bar:
            ctx.transport.round_index = k
            synchronize(ctx.device)
            start = time.perf_counter()
            losses = algorithm.round(k)
            check_round_result(algorithm, ctx, k, losses, shape)
            synchronize(ctx.device)  # the round's queued GPU work is part of its time
            if rank == 0 and cfg.save_edges and write:
                with (run_dir / "edges.jsonl").open("a") as fh:
                    fh.write(_edges_line(ctx, k))
            last = k == cfg.rounds - 1
            seconds = time.perf_counter() - start
            row = log.record(k, losses, seconds, round_start, last or (k + 1) % cfg.eval_every == 0)
            round_start = time.perf_counter()
            if board is not None and row:
                board.add(row)
            head = ctx.stack.task.headline
            if row and f"test_{head}" in row:
                bar.set_postfix({head: ctx.stack.task.format(row[f"test_{head}"]),
                                 "clients": ctx.stack.task.format(row[f"client_{head}_mean"])})
            if last:
                break
            due = checkpoint_due(cfg.checkpoint_every, k + 1, time.monotonic() - last_save)
            stopping, due = ctx.transport.agree(stop.requested, due)  # every rank takes the same turn
            if (due or stopping) and write and algorithm.resumable_after(k + 1):
                checkpoint.save(ctx, algorithm, log.rows, k + 1, run_dir)
                saved, last_save = k + 1, time.monotonic()
            if stopping:
                raise Interrupted(f"stopped after round {k + 1}; {_resume_hint(run_dir, saved)}")
            if write and algorithm.resumable_after(k + 1) and k + 1 > saved:
                # ranks may be a collective apart when a signal lands: under MPI keep two rounds
                held = [*(held[-1:] if size > 1 else []), checkpoint.capture(ctx, algorithm, log.rows, k + 1)]
        final = algorithm.finish(run_dir if rank == 0 else None)
        state = final_model(ctx, log) if rank == 0 else None
        if rank == 0 and write:
            save_final(run_dir, final, state)
            shutil.rmtree(run_dir / checkpoint.FOLDER, ignore_errors=True)  # a finished run needs none
    except KeyboardInterrupt:
        saved = save_held(ctx, held, run_dir, saved)
        raise Interrupted(f"stopped in round {k + 1} by {stop.by}; {_resume_hint(run_dir, saved)}",
                          130 if stop.by == "Ctrl-C" else 143) from None
    finally:
        stop.uninstall()
        bar.close()
        if board is not None:
            board.close()
        if rank == 0 and log.rows and write:
            graph = "star" if cfg.topology == "star" else f"{cfg.topology} kappa={cfg.kappa:g}"
            try:
                plot_metric(log.rows, ctx.stack.task, run_dir, f"{cfg.algo}: {cfg.peers} peers, {graph}, {cfg.model} on "
                            f"{cfg.dataset} {cfg.partition}" + (f" alpha={cfg.alpha:g}" if cfg.partition == "dirichlet"
                                                                else ""))
            except OSError as exc:  # a full disk or a read-only folder: the run's own error says so, not this
                print(f"p2pfl: the plot was not drawn ({exc.strerror or exc})", file=sys.stderr)
    if rank == 0:
        print(summary_line(log.rows, ctx.stack.task, run_dir), file=sys.stderr)
    rows, final, state = (log.rows, final, state) if rank == 0 else ([], None, None)
    if everywhere:
        rows, final, state = ctx.transport.bcast((rows, final, state) if rank == 0 else None)
    return Result(rows, state, final, run_dir, cfg)


class StopRequest:
    """Ctrl-C asks the run to finish its round, write a checkpoint and stop (exit 130); a second Ctrl-C,
    or SIGTERM (a scheduler's stop or preemption; what mpirun sends the other ranks when one dies), stops
    at once and saves the last completed round from memory (exit 143 for SIGTERM)."""

    def __init__(self, rank: int, transport=None):
        global started
        started = True
        self.requested, self.rank, self.by, self.now, self.remote = False, rank, "Ctrl-C", False, None
        self.transport = transport
        in_main_thread = threading.current_thread() is threading.main_thread()  # only it may set handlers
        self.previous = {s: signal.signal(s, self.on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)} \
            if in_main_thread else {}
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
        if signum == signal.SIGTERM:
            self.by = "SIGTERM (a scheduler's stop; under mpirun also when a rank died)"
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
            print("\np2pfl: interrupted: finishing this round, then a checkpoint (Ctrl-C again stops at once)",
                  file=sys.stderr)

    def uninstall(self) -> None:
        if self.transport is not None:
            self.transport.stop_watching()
        for s, handler in self.previous.items():
            signal.signal(s, handler)
        if self.watcher is not None:
            self.watcher.close()


# Seconds a stop by signal waits for the other ranks while it saves: every rank signalled leaves its
# compute within a step (p2pfl.stopping), so they meet within a second or two; a dead rank is what the
# wait gives up on. The whole stop stays within 10 s. launch/slurm.sh asks for the signal 90 s before the limit.
EMERGENCY_TIMEOUT = 5.0


def save_held(ctx, held: list[dict], run_dir: Path, saved: int) -> int:
    """After SIGTERM or a second Ctrl-C: write the newest round every rank holds a capture of, if it is
    newer than the last checkpoint; returns the round the run folder now has a checkpoint of. Under MPI
    the ranks first agree on that round, waiting a few seconds at most: a rank that died (mpirun sends
    SIGTERM to the others then) leaves the previous checkpoint as it was."""
    transport, timeout = ctx.transport, ctx.transport.timeout
    transport.timeout = min(timeout, EMERGENCY_TIMEOUT)
    try:
        with transport.emergency():  # apart from a collective the signal cut short
            rounds = transport.gather([state["round"] for state in held])
            common = transport.bcast(max(set.intersection(*map(set, rounds)), default=0) if rounds is not None
                                     else None)
            if common <= saved:
                return saved
            checkpoint.write(next(state for state in held if state["round"] == common), run_dir, transport)
            transport.barrier()  # latest.json is written before any rank exits (mpirun ends the job at the first)
            return common
    except Exception as exc:  # noqa: BLE001 - a dead rank, a full disk, a collective cut by the signal
        if transport.rank == 0:
            print(f"p2pfl: the last rounds could not be saved ({exc.__class__.__name__}: {exc})", file=sys.stderr)
        return saved
    finally:
        transport.timeout = timeout


def checkpoint_due(every: int | None, rounds_done: int, since_last: float) -> bool:
    if every is None:
        return since_last >= CHECKPOINT_SECONDS
    return every > 0 and rounds_done % every == 0


def _resume_hint(run_dir: Path | None, saved: int) -> str:
    if run_dir is None:
        return "the run wrote no folder (out=None), so there is nothing to resume"
    if not saved:
        return f"no checkpoint was written; run folder: {run_dir}"
    return f"checkpoint after round {saved}; continue with: python -m p2pfl.run --resume {run_dir}"


def _edges_line(ctx, k: int) -> str:
    return json.dumps({"round": k + 1, "edges": sorted(ctx.schedule.graph(k).edges)}) + "\n"


def final_model(ctx, log) -> dict[str, torch.Tensor] | None:
    """The aggregated model's state dict on the CPU (rank 0), where a round was evaluated or a star's
    server holds it."""
    if log.last_weights is None and ctx.global_weights is None:  # a star's server model needs no gather
        return None
    model = run_model(ctx, log.last_weights, log.algorithm)
    return {k: v.cpu().clone() for k, v in ctx.stack.layout.views(model).items()}  # loadable anywhere


def save_final(run_dir: Path, final: dict | None, state: dict[str, torch.Tensor] | None) -> None:
    """final.json (the algorithm's closing results) and model.pt (the aggregated model's state dict)."""
    if final:
        (run_dir / "final.json").write_text(json.dumps(final, indent=1))
    if state is not None:
        checkpoint.atomic_write(run_dir / "model.pt", lambda path: torch.save(state, path))


def summary_line(rows: list[dict], task, run_dir: Path | None) -> str:
    head, where = task.headline, f"run folder: {run_dir}" if run_dir else "no run folder"
    evaluated = [r for r in rows if f"test_{head}" in r]
    if not evaluated:
        return where
    last = evaluated[-1]
    name = {"acc": "accuracy"}.get(head, head)
    return (f"round {last['round']}: aggregated test {name} {task.format(last[f'test_{head}'])}, mean client "
            f"{task.format(last[f'client_{head}_mean'])}; {where}")


