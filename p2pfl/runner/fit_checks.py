"""Does the run fit this machine and its data: the data folder, the run folder (new, empty or
--overwrite, and writable), the loaded data's sizes, the model's memory for the peers here, and the
share of a GPU that the ranks on it take."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from p2pfl.comm import rank0_decides, ranks_sharing_this_machine
from p2pfl.settings.run_config import RunConfig, machine_memory
from p2pfl.errors import UserError
from p2pfl.runner.paths import PROBE_PREFIX, checked_path, ours


def check_data_dir(cfg: RunConfig, spec) -> None:
    """--data-dir must be a folder, and only for datasets read from files."""
    if cfg.data_dir is None:
        return
    if spec.generated:
        raise UserError(f"--data-dir does not apply to --dataset {spec.name}, which is generated, not read from files")
    if not Path(cfg.data_dir).is_dir():
        raise UserError(f"--data-dir {cfg.data_dir} is not a folder")


def check_out(cfg: RunConfig) -> None:
    """A run folder is never clobbered by accident: --out must be new, empty, or given with --overwrite."""
    if cfg.out is None:
        _check_writable(Path("runs"))  # where the default run folder goes
        return
    if not str(cfg.out).strip():
        raise UserError("--out must name a folder, got an empty name")
    text = str(cfg.out)
    path = checked_path(Path(cfg.out), f"--out {text if len(text) <= 100 else text[:60] + '...'}")
    if path.exists() and not path.is_dir():
        raise UserError(f"--out {cfg.out} is a file, not a folder")
    held = [p for p in path.iterdir() if not ours(p)] if path.is_dir() else []  # a lock is no run
    if rank0_decides(bool(held)) and not (cfg.overwrite or cfg.resume):  # as rank 0 saw it, before writing
        raise UserError(
            f"--out {cfg.out} already holds files (a finished run?); choose a new folder or add --overwrite"
        )
    _check_writable(path)


def _check_writable(path: Path) -> None:
    """The run folder can be made (or written into): tried with a throwaway folder in the nearest existing
    ancestor, removed at once, so that a bad --out fails here and not after the data has loaded."""
    target = path if path.is_dir() else path.parent
    while not target.exists():
        target = target.parent
    if not target.is_dir():
        raise UserError(f"--out {path} cannot be made: {target} is a file")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=PROBE_PREFIX, dir=target))
    except OSError as exc:
        raise UserError(f"--out {path} cannot be made in {target} ({exc.strerror or exc.__class__.__name__})")


def check_data_fit(cfg: RunConfig, train_samples: int, test_samples: int, sample_numel: int = 1) -> None:
    """Options that must fit the data, checked once it is loaded and before anything is made of it: a
    minibatch of --batch-size for every peer (its index plan, 8 bytes a sample, and its float32 inputs)
    must fit this machine's memory, so a typo such as --batch-size 1000000000 is one line, not 32 GB."""
    if cfg.peers > train_samples:
        raise UserError(
            f"--peers {cfg.peers} exceeds the {train_samples:,} training samples of {cfg.dataset}: "
            "a peer needs at least one"
        )
    if cfg.test_samples is not None and cfg.test_samples > test_samples:
        raise UserError(f"--test-samples {cfg.test_samples} exceeds the {test_samples:,} test samples of {cfg.dataset}")
    need = cfg.peers * (cfg.batch_size or 1) * (8 + 4 * sample_numel)
    have = machine_memory("cpu")[1]
    if need > have:
        raise UserError(
            f"--batch-size {cfg.batch_size:,} for {cfg.peers} peers needs about {need / 2**30:,.1f} GiB of "
            f"minibatches, more than this machine's {have / 2**30:,.1f} GiB; a batch beyond a peer's "
            f"{cfg.samples_per_peer} samples holds no more than them"
        )


STACK_COPIES = 4  # a peer's weights, its update or gradient, an optimizer buffer and a received copy


def ranks_per_gpu(choice: str) -> int:
    """The local ranks that share each GPU: all of them on a GPU named by its index, else the ranks
    spread over the GPUs by local rank (rounded up)."""
    local = ranks_sharing_this_machine()
    return local if choice.startswith("cuda:") else -(-local // torch.cuda.device_count())


def gpu_share(device: torch.device, choice: str, peers_here: int) -> tuple[str, int, int] | None:
    """(device, its bytes, the peers of the ranks that share it) for a GPU; None for the CPU."""
    if device.type != "cuda":
        return None
    return str(device), torch.cuda.get_device_properties(device).total_memory, peers_here * ranks_per_gpu(choice)


def check_model_memory(cfg: RunConfig, n_params: int, peers_here: int, gpu: tuple[str, int, int] | None = None) -> None:
    """Refuse a model that could not be held for the peers on this machine (float32, STACK_COPIES copies)
    before it is allocated: a typo such as --hidden 100000000 ends in one line, not an allocator error.
    gpu: (name, bytes, peers on it) where the rank's tensors live on a GPU, which must hold them too."""
    per_peer = STACK_COPIES * 4 * n_params
    if gpu is not None and per_peer * max(1, gpu[2]) > gpu[1]:
        raise UserError(
            f"--model {cfg.model} has {n_params:,} parameters; {gpu[2]} peers on {gpu[0]} would need "
            f"about {per_peer * max(1, gpu[2]) / 2**30:,.1f} GiB, more than its {gpu[1] / 2**30:,.1f} GiB: "
            "use fewer peers per GPU (more ranks or GPUs, or fewer --peers), a smaller model, or --device cpu"
        )
    need = per_peer * max(1, peers_here)
    have = machine_memory("cpu")[1]
    if need > have:
        raise UserError(
            f"--model {cfg.model} has {n_params:,} parameters; {peers_here} peers on this machine would "
            f"need about {need / 2**30:,.1f} GiB, more than its {have / 2**30:,.1f} GiB of memory"
        )
