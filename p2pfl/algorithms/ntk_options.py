"""The settings NTK-DFL, NTK-FL and CP-NTK-FL share, and what they make of them: the NTK step's
settings, the Jacobian codec, the input projection and the memory cap of dense Jacobians."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass

import torch

from p2pfl.settings.fields import bits, fraction, non_negative, option, positive, positive_ints
from p2pfl.comm import Payload
from p2pfl import stopping
from p2pfl.errors import UserError
from p2pfl.models import model_spec
from p2pfl.ntk.codec import JacobianCodec
from p2pfl.ntk.compression import project_dataset
from p2pfl.ntk.plan import GB
from p2pfl.ntk.precompile import loop_is_cached
from p2pfl.ntk.step import NTKSettings

MAX_TAU = 100_000  # the evolution's work grows with the largest t (the papers' go to 2,000)


def step_counts(v) -> str | None:
    """Positive, bounded (an evolution integrates every unit up to the largest) and each given once (a
    candidate twice left an evolution's row unwritten)."""
    problem = positive_ints(v)
    if problem:
        return problem
    twice = sorted({int(x) for x in v if [int(y) for y in v].count(int(x)) > 1})
    if twice:
        return f"names each candidate once; given more than once: {', '.join(map(str, twice))}"
    if max(int(x) for x in v) <= MAX_TAU:
        return None
    return f"takes at most {MAX_TAU:,} steps (the evolution's work grows with the largest), got {max(map(int, v)):,}"


@dataclass
class JacobianMessage(Payload):
    """A peer's outputs and labels with the Jacobian of its samples (as sent: factors, dense or compressed)."""

    outputs: torch.Tensor
    labels: torch.Tensor
    jacobian: tuple[torch.Tensor, ...]

    @classmethod
    def of(cls, codec: JacobianCodec, jac, f: torch.Tensor, y: torch.Tensor) -> tuple[JacobianMessage, int]:
        """The message of a Jacobian and what it would weigh with the dense J."""
        return cls(f.detach(), y, codec.to_wire(jac)), codec.dense_bytes(f, y)

    def read(self, codec: JacobianCodec):
        """(Jacobian, outputs, labels) on the run's device."""
        return codec.read(self.jacobian, self.outputs, self.labels)


@dataclass(frozen=True)
class NTKOptions:
    ntk_taus: tuple[int, ...] = option(
        (100, 200, 300, 400, 500, 600, 700, 800), "candidate evolution steps t, comma-separated", step_counts
    )
    ntk_loss: str = option(
        "ce",
        "kernel evolution: ce (ODE, as the reference code) or mse (the reference code's closed "
        "form: rate eta/(N C), right sums, t selected by squared error)",
        choices=("ce", "mse"),
    )
    ntk_ode: str = option(
        "split",
        "CE evolution: split (accurate ODE solution, as the reference code's solver; "
        "fast: Runge-Kutta with the kernel's stiff top subspace exact and the rest extrapolated), "
        "adaptive (ODE solver with error control; slower), euler (unit steps = gradient descent "
        "on the linearized model, not the ODE) or deflated (those Euler steps, faster)",
        choices=("split", "adaptive", "euler", "deflated"),
    )
    ntk_selection: str = option(
        "network",
        "pick t by: network (the true network's loss on the round's training "
        "samples: NTK-FL's eq. 11a, NTK-DFL's reference code), linearized (the loss of the "
        "evolved outputs, NTK-DFL's appendix C; it falls with t, so it takes the largest "
        "candidate), own (NTK-DFL: the true loss on the peer's own samples) or validation "
        "(NTK-FL, CP-NTK-FL: the true loss on held-out clients' samples)",
        choices=("network", "linearized", "own", "validation"),
    )
    ntk_jacobian: str = option(
        "auto",
        "Jacobian path: auto (factored for MLPs, else dense), factored (exact, "
        "fast, MLPs only) or dense (any model; needed by compression)",
        choices=("auto", "factored", "dense"),
    )
    ntk_topk: float = option(1.0, "Jacobian compression: keep this fraction of entries (top-k by magnitude)", fraction)
    ntk_quant_bits: int = option(0, "Jacobian compression: quantize kept entries to this many bits (0 = off)", bits)
    ntk_projection: int = option(
        0, "project inputs to this many dims with a shared-seed Gaussian matrix (0 = off; MLP only)", non_negative
    )
    ntk_projection_entries: str = option(
        "scaled",
        "the projection's entries: scaled (N(0, 1/d1'), keeps input "
        "norms on average) or standard (N(0, 1), as the NTK-FL paper writes it: "
        "inputs sqrt(d1') times larger, the kernel about d1' times)",
        choices=("scaled", "standard"),
    )
    ntk_memory_gb: float = option(
        8.0,
        "cap on the dense Jacobians a rank holds at once, in GB (NTK-DFL holds them "
        "a group of neighbourhoods at a time; a run where one neighbourhood, or NTK-FL's "
        "round, would exceed it is refused before it starts)",
        positive,
    )

    def step_settings(self) -> NTKSettings:
        return NTKSettings(self.ntk_loss, tuple(self.ntk_taus), self.ntk_ode, self.ntk_selection)


def compile_ahead(ctx, options: NTKOptions) -> None:
    """Where the run's CE evolutions go through the compiled (numba) integrator loop and this machine's
    numba cache lacks it, rank 0 compiles it now, in a child process (python -m p2pfl.ntk.precompile),
    while the other ranks wait. Compiled in this process, the first evolution would hold the main thread
    in numba for a minute or two, where no signal is handled: a scheduler's SIGTERM then took 143 s. The
    child is waited for in short sleeps, so a stop is honoured at once, and the child ends with it."""
    if not (options.ntk_loss == "ce" and options.ntk_ode in ("split", "deflated")):
        return
    if ctx.transport.rank == 0 and not loop_is_cached():
        print(
            "p2pfl: compiling the NTK integrator loop (numba) for this machine: about 1-2 minutes, once "
            "(make install does it ahead)",
            file=sys.stderr,
        )
        child = subprocess.Popen(
            [sys.executable, "-m", "p2pfl.ntk.precompile"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        stopping.CHILDREN.append(child)
        try:
            while child.poll() is None:
                time.sleep(0.05)  # a signal's handler runs between these sleeps
        finally:
            stopping.CHILDREN.remove(child)
            if child.poll() is None:
                child.kill()
        if child.returncode != 0:  # the first evolution compiles it in this process, as before
            print(
                f"p2pfl: compiling ahead failed ({child.stderr.read().decode(errors='replace')[-300:].strip()})",
                file=sys.stderr,
            )
    ctx.transport.barrier()  # the other ranks load what rank 0 compiled


def make_codec(ctx, options: NTKOptions) -> JacobianCodec:
    """The codec for this run; a dense Jacobian is computed a chunk of samples at a time, the chunk sized
    so that jacrev's working set (about four Jacobians of the chunk) stays within a tenth of the cap."""
    per_sample = ctx.data.n_classes * ctx.stack.layout.trainable * 4
    chunk = max(1, min(50, int(options.ntk_memory_gb * GB / 10 / (4 * per_sample))))
    try:
        return JacobianCodec(
            ctx.stack.model,
            ctx.stack.layout,
            ctx.device,
            options.ntk_jacobian,
            options.ntk_topk,
            options.ntk_quant_bits,
            chunk,
        )
    except ValueError as exc:
        raise UserError(str(exc))


def project_inputs(data, cfg) -> None:
    """--ntk-projection: inputs become d1'-vectors, which only a model of flat inputs can take."""
    if cfg.settings.ntk_projection:
        if model_spec(cfg.model).images:
            raise UserError(f"--ntk-projection turns images into vectors; --model {cfg.model} needs images")
        features = data.train_x[0].numel()
        if cfg.settings.ntk_projection >= features:
            raise UserError(
                f"--ntk-projection {cfg.settings.ntk_projection} does not reduce the {features} input "
                f"features of {data.name}; use fewer dimensions (or 0 for none)"
            )
        project_dataset(data, cfg.settings.ntk_projection, cfg.seed, cfg.settings.ntk_projection_entries == "standard")
