"""A run's folder and its files: made (or taken back for --resume) under a lock, its header (config.toml,
the partition, the topology), each round's edges, the closing files (final.json, model.pt), the metric
plot and the summary line. Algorithms add their own products in finish()."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import shutil
import statistics
import stat
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from p2pfl.runner import provenance
from p2pfl.runner.checkpoint import files as checkpoint
from p2pfl.algorithms import REGISTRY
from p2pfl.plugins import call_hook
from p2pfl.algorithms.server import clients_per_round
from p2pfl.settings.run_config import RunConfig
from p2pfl.runner.configure import resolved_dict
from p2pfl.data import summary
from p2pfl.errors import UserError
from p2pfl.models import count_parameters
from p2pfl.runner.paths import LOCK_NAME, ours, refuse_link
from p2pfl.measure.figures import PLOT_FILES, plot_metric, plot_run_header
from p2pfl.runner.graph_schedule import describe


class FolderLock:
    """A run folder's lock while a run writes it (an exclusive flock on the file NAME inside): a second run into
    the same folder (a resume, an --overwrite, a sweep's run) is refused instead of writing beside it. The
    kernel drops the lock when the process ends, however it ends. The lock file is opened without following
    a link and without blocking, so that a link (to a file elsewhere, or to nothing) or a named pipe planted
    under its name is refused in one line instead of writing elsewhere or waiting for ever."""

    NAME = LOCK_NAME

    def __init__(self, folder: Path, made: bool = False):
        self.folder, self.made = Path(folder), made  # made: this run made the folder (removed if left empty)
        path = Path(folder) / self.NAME
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(path, flags, 0o644)
        except OSError as exc:
            what = "a link" if path.is_symlink() else (exc.strerror or str(exc)).lower()
            raise UserError(f"{path} cannot be the run's lock file: it is {what}; remove it") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise UserError(
                f"{path} cannot be the run's lock file: it is not a regular file (a pipe or device?); remove it"
            )
        self.handle = os.fdopen(fd, "a")
        try:
            fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.handle.close()
            raise UserError(
                f"{folder} is in use: a run is writing it now; wait for it to end, or choose another --out"
            ) from None

    def release(self) -> None:
        """Drop the lock; a folder this run made and left holding nothing but the lock (a run refused or
        failed before writing) goes too, so a failed start leaves no trace."""
        self.handle.close()  # closing drops the flock
        if self.made and [p.name for p in self.folder.iterdir()] == [self.NAME]:
            (self.folder / self.NAME).unlink(missing_ok=True)
            try:
                self.folder.rmdir()
            except OSError:  # someone wrote into it meanwhile: theirs
                pass


LOCKS: list[FolderLock] = []  # the run folders this process writes, locked until execute() ends
# What a run writes into its folder, by name: an overwritten run's are removed first, so that one folder
# never holds two runs (an NTK-DFL run's final.json beside a DFedAvg run's metrics), and nothing else is:
# a user's own files in the folder stay. The algorithms' own products are named by each (Algorithm.products).
RUN_FILES = (
    "config.toml",
    "metrics.jsonl",
    "edges.jsonl",
    "final.json",
    "model.pt",
    "partition.json",
    "partition.png",
    "topology.png",
    *PLOT_FILES.values(),
    checkpoint.FOLDER,
    "tensorboard",
)


def run_files() -> list[str]:
    """Every name a run may write, whichever algorithm ran (a temporary's too: model.pt.tmp)."""
    names = [*RUN_FILES, *(name for cls in REGISTRY.values() for name in cls.products)]
    return sorted({n for name in names for n in (name, f"{name}.tmp")})


def made_or_refused(cfg: RunConfig) -> Path | UserError:
    try:
        return make_run_dir(cfg)
    except UserError as exc:
        return exc


def make_run_dir(cfg: RunConfig) -> Path:
    """The run folder, taken (locked) before anything in it is removed or written and before any data is
    read: a second run into it is refused, and so is a folder that came to hold files since the start-up
    check (a run that finished there meanwhile) unless --overwrite. --overwrite removes the run's own
    files by name; a link among them is refused."""
    if cfg.resume:
        LOCKS.append(FolderLock(Path(cfg.resume)))
        return Path(cfg.resume)
    if cfg.out:
        path = Path(cfg.out)
    else:
        path = Path("runs") / f"{cfg.algorithm.name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
        suffix = 1
        while path.exists():
            path = path.with_name(f"{path.name.split('~')[0]}~{suffix}")
            suffix += 1
    made = not path.exists()
    path.mkdir(parents=True, exist_ok=True)
    LOCKS.append(FolderLock(path, made))  # before anything in it changes: a run writing it now is not disturbed
    if not cfg.overwrite and not all(ours(p) for p in path.iterdir()):
        raise UserError(
            f"--out {path} now holds files (a run that finished there?); choose a new folder or add --overwrite"
        )
    products = [path / name for name in run_files() if (path / name).exists() or (path / name).is_symlink()]
    for product in products:
        refuse_link(product, path, f"--out {path}")
    for product in products:
        if product.is_dir():
            shutil.rmtree(product, ignore_errors=True)
        else:
            product.unlink(missing_ok=True)
    return path


def announce(ctx, algorithm, run_dir: Path | None, write: bool, devices: list | None) -> None:
    """The run header: each rank's device (devices: device_facts gathered at rank 0) and the algorithm's
    notes, in config.toml (a new run's) and, on stderr, the device where a GPU is used and the notes."""
    notes = call_hook(algorithm, "notes")
    if ctx.transport.rank != 0:
        return
    notes = [*notes, *ctx.cfg.notes, *network_note(ctx.cfg, ctx.network)]
    placed = device_note([device for device, _ in devices])
    if write and not ctx.cfg.resume:  # a resumed run's header is the one it started with
        write_run_header(ctx, run_dir, [placed, *notes], [name for _, name in devices if name])
    for note in ([placed] if any(d != "cpu" for d, _ in devices) else []) + notes:  # CPU runs: config.toml only
        print(f"p2pfl: {note}", file=sys.stderr)


def network_note(cfg: RunConfig, network) -> list[str]:
    """The run header's line on the virtual clock's network model, where one is asked for (none: the unit
    clock and peers that stay)."""
    parts = []
    if network.step_times is not None:
        times = sorted(network.step_times)
        median = statistics.median(times)
        spread = f" (median; {times[0]:.3g} to {times[-1]:.3g} s over the peers)" if times[0] != times[-1] else ""
        speed = f", the model's FLOPs at {cfg.peer_flops:g} FLOP/s" if cfg.peer_flops is not None else ""
        parts.append(f"a local step {median:.3g} s{speed}{spread}")
    if cfg.link_latency or cfg.link_bandwidth is not None:
        speed = f" + bytes at {cfg.link_bandwidth:g} B/s" if cfg.link_bandwidth is not None else ""
        spread = f", spread sigma {cfg.link_spread:g}" if cfg.link_spread else ""
        parts.append(f"links {cfg.link_latency:g} s{speed}{spread}")
    if cfg.availability_file:
        parts.append(f"peers away as {cfg.availability_file} says")
    elif cfg.churn:
        parts.append(
            f"{round(cfg.churn * cfg.peers)} peers churning (present {cfg.churn_online:g} s, away "
            f"{cfg.churn_offline:g} s on average)"
        )
    return [f"network model: {', '.join(parts)}"] if parts else []


def device_facts(device: torch.device) -> tuple[str, str | None]:
    """This rank's device and the GPU's model name (None on the CPU), for the run header."""
    return str(device), torch.cuda.get_device_name(device) if device.type == "cuda" else None


def device_note(devices: list[str]) -> str:
    """Which device each rank got, for the run header: 'device cpu', or 'devices cuda:0 (ranks 0, 2), ...'."""
    ranks: dict[str, list[int]] = {}
    for r, d in enumerate(devices):
        ranks.setdefault(d, []).append(r)
    named = {d: f"{d} ({torch.cuda.get_device_name(torch.device(d))})" if d.startswith("cuda") else d for d in ranks}
    if len(ranks) == 1:
        return f"device {named[devices[0]]}" + (f" on all {len(devices)} ranks" if len(devices) > 1 else "")
    return "devices " + "; ".join(
        f"{named[d]} on rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}" for d, r in ranks.items()
    )


def write_run_header(ctx, run_dir: Path, notes: list[str], gpus: list[str]) -> None:
    cfg = ctx.cfg
    write_toml(
        {**resolved_dict(cfg), provenance.TABLE: provenance.record(gpus, cfg)},
        run_dir / "config.toml",
        (
            f"model {cfg.model}: {count_parameters(ctx.stack.model):,} parameters, "
            f"{ctx.stack.layout.size - ctx.stack.layout.trainable:,} state values (batch norm statistics)",
            *notes,
        ),
    )
    parts = summary([s.numpy() for s in ctx.shards], ctx.data.train_y.cpu().numpy(), ctx.data.n_classes)
    (run_dir / "partition.json").write_text(json.dumps(parts))
    if cfg.algorithm.centralized:
        title = (
            f"star: the server (node {cfg.peers}) and {cfg.peers} clients, "
            f"{clients_per_round(cfg.settings, cfg.peers)} sampled each round"
        )
    else:
        title = (
            f"{describe(cfg)} ({'round 1 of a new graph each round' if ctx.schedule.varies else 'static'}), "
            f"{cfg.peers} peers"
        )
    plot_run_header(parts, ctx.data.class_names, ctx.schedule.graph(0), title, run_dir)


def save_final(run_dir: Path, final: dict | None, state: dict[str, torch.Tensor] | None) -> None:
    """final.json (the algorithm's closing results) and model.pt (the aggregated model's state dict); a
    finished run needs no checkpoint."""
    if final:
        (run_dir / "final.json").write_text(json.dumps(final, indent=1))
    if state is not None:
        checkpoint.atomic_write(run_dir / "model.pt", lambda path: torch.save(state, path))
    shutil.rmtree(run_dir / checkpoint.FOLDER, ignore_errors=True)


def plot_rows(cfg: RunConfig, rows: list[dict], task, run_dir: Path) -> None:
    """The headline metric over the rounds; a failure to draw it is a line, not the run's error."""
    graph = "star" if cfg.topology == "star" else describe(cfg)
    own = (  # the algorithm's settings the user gave: a codec, CHOCO's gamma
        [f"{f.name}={getattr(cfg.settings, f.name)}" for f in dataclasses.fields(cfg.settings) if f.name in cfg.given]
        if dataclasses.is_dataclass(cfg.settings)
        else []
    )
    title = (
        f"{cfg.algo}{' (' + ', '.join(own) + ')' if own else ''}: {cfg.peers} peers, {graph}, {cfg.model} on "
        f"{cfg.dataset} {cfg.partition}" + (f" alpha={cfg.alpha:g}" if cfg.partition == "dirichlet" else "")
    )
    try:
        plot_metric(rows, task, run_dir, title)
    except OSError as exc:  # a full disk or a read-only folder: the run's own error says so, not this
        print(f"p2pfl: the plot was not drawn ({exc.strerror or exc})", file=sys.stderr)


def summary_line(rows: list[dict], task, run_dir: Path | None) -> str:
    """The run's last line on stderr: its last evaluated headline metric, aggregated and mean client, and its folder."""
    head, where = task.headline, f"run folder: {run_dir}" if run_dir else "no run folder"
    evaluated = [r for r in rows if f"test_{head}" in r]
    if not evaluated:
        return where
    last = evaluated[-1]
    name = {"acc": "accuracy"}.get(head, head)
    return (
        f"round {last['round']}: aggregated test {name} {task.format(last[f'test_{head}'])}, mean client "
        f"{task.format(last[f'client_{head}_mean'])}; {where}"
    )


def write_toml(values: dict[str, Any], path: Path, comments: tuple[str, ...] = ()) -> None:
    """config.toml: comment lines first (facts of the run that are not settings), then the values written
    by tomli-w, the writer that pairs with tomllib, so that every value reads back as it was (a folder name
    with a newline or a control character too)."""
    import tomli_w

    notes = "".join(f"# {_printable(c)}\n" for c in comments)
    path.write_text(notes + tomli_w.dumps(values))


def _printable(text: str) -> str:
    """One comment line: control characters (a newline would end the comment) as escapes."""
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode() for ch in str(text))
