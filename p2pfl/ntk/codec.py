"""How NTK algorithms compute a Jacobian, put it into message tensors and read it back."""

from __future__ import annotations

import torch
from torch import nn

from p2pfl.models.mlp import MLP, MLPShape
from p2pfl.models.layout import ParamLayout
from p2pfl.ntk.compression import decode, encode
from p2pfl.ntk.jacobian import DenseJacobian, FactoredJacobian


def jacobian_path(choice: str, model: nn.Module, compress: bool) -> str:
    """'auto' is factored for MLPs without compression, dense otherwise. Raises ValueError where the
    factored path cannot serve."""
    if choice == "auto":
        return "factored" if isinstance(model, MLP) and not compress else "dense"
    if choice == "factored" and compress:
        raise ValueError("Jacobian compression acts on dense entries; use --ntk-jacobian dense (or auto)")
    if choice == "factored" and not isinstance(model, MLP):
        raise ValueError(
            f"the factored Jacobian serves MLPs only, not {type(model).__name__}; use --ntk-jacobian dense (or auto)"
        )
    return choice


class JacobianCodec:
    """Computes a Jacobian at given weights and turns it into a message and back."""

    def __init__(
        self,
        model: nn.Module,
        layout: ParamLayout,
        device: torch.device,
        path: str = "auto",
        keep: float = 1.0,
        bits: int = 0,
        chunk: int = 50,
    ):
        self.model, self.layout, self.device = model, layout, device
        self.keep, self.bits, self.chunk = keep, bits, chunk
        self.path = jacobian_path(path, model, keep < 1 or bits > 0)
        self.shape = MLPShape.of(model, layout) if self.path == "factored" else None
        self.n_params = layout.trainable

    def compute(self, w: torch.Tensor, x: torch.Tensor):
        if self.path == "factored":
            return FactoredJacobian.compute(self.shape, w, x)
        return DenseJacobian.compute(self.model, self.layout, w, x, self.chunk)

    def compute_many(self, ws: torch.Tensor, x: torch.Tensor) -> list[tuple]:
        """compute at each row of ws (K, D) on the same inputs: batched products where factored."""
        if self.path == "factored":
            return FactoredJacobian.compute_many(self.shape, ws, x)
        return [self.compute(w, x) for w in ws]

    def to_wire(self, jac) -> tuple[torch.Tensor, ...]:
        if self.path == "dense" and (self.keep < 1 or self.bits):
            return encode(jac.J, self.keep, self.bits)
        return jac.to_wire()

    def from_wire(self, tensors):
        if self.path == "factored":
            return FactoredJacobian.from_wire(tensors)
        if self.keep < 1 or self.bits:
            return DenseJacobian(decode(tuple(t.cpu() for t in tensors)).to(self.device))
        return DenseJacobian.from_wire(tensors)

    def cat(self, parts, input_grams=None, pixels=None):
        """The parts stacked; input_grams (each part's inputs Gram, where known) or pixels (the stacked inputs'
        pixel codes) serve the factored kernel."""
        if self.path == "factored":
            return FactoredJacobian.cat(parts, input_grams, pixels)
        return DenseJacobian.cat(parts)

    def dense_bytes(self, f: torch.Tensor, y: torch.Tensor) -> int:
        """What a message of these outputs and labels would weigh with the dense J."""
        n, n_classes = f.shape
        return n * n_classes * self.n_params * 4 + f.numel() * 4 + y.numel() * y.element_size()

    def read(self, wire: tuple[torch.Tensor, ...], f: torch.Tensor, y: torch.Tensor):
        """(Jacobian, outputs, labels) on the run's device, from what a message carried."""
        return self.from_wire(tuple(t.to(self.device) for t in wire)), f.to(self.device), y.to(self.device)
