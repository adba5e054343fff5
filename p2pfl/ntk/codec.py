"""How NTK algorithms compute a Jacobian, put it into message tensors and read it back."""
from __future__ import annotations

import torch

from p2pfl.errors import UserError
from p2pfl.ntk.compression import decode, encode
from p2pfl.ntk.jacobian import DenseJacobian, FactoredJacobian, MLPShape
from p2pfl.ntk.step import NTKSettings


def ntk_settings(cfg) -> NTKSettings:
    e = cfg.extras
    return NTKSettings(e["ntk_loss"], tuple(e["ntk_taus"]), e["ntk_ode"], e["ntk_selection"])


def jacobian_path(cfg) -> str:
    """'auto' is factored, except where compression needs dense entries."""
    e = cfg.extras
    compress = e.get("ntk_topk", 1.0) < 1 or e.get("ntk_quant_bits", 0) > 0
    path = e.get("ntk_jacobian", "auto")
    if path == "auto":
        return "dense" if compress else "factored"
    if path == "factored" and compress:
        raise UserError("Jacobian compression acts on dense entries; use --ntk-jacobian dense (or auto)")
    return path


class JacobianCodec:
    """Computes a Jacobian at given weights and turns it into message tensors and back."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.path = jacobian_path(ctx.cfg)
        self.keep = ctx.cfg.extras.get("ntk_topk", 1.0)
        self.bits = ctx.cfg.extras.get("ntk_quant_bits", 0)
        self.shape = MLPShape.of(ctx.stack.model, ctx.stack.layout) if self.path == "factored" else None
        self.n_params = ctx.stack.layout.size

    def compute(self, w: torch.Tensor, x: torch.Tensor):
        if self.path == "factored":
            return FactoredJacobian.compute(self.shape, w, x)
        return DenseJacobian.compute(self.ctx.stack.model, self.ctx.stack.layout, w, x)

    def to_wire(self, jac) -> tuple[torch.Tensor, ...]:
        if self.path == "dense" and (self.keep < 1 or self.bits):
            return encode(jac.J, self.keep, self.bits)
        return jac.to_wire()

    def from_wire(self, tensors):
        if self.path == "factored":
            return FactoredJacobian.from_wire(tensors)
        if self.keep < 1 or self.bits:
            return DenseJacobian(decode(tuple(t.cpu() for t in tensors)).to(self.ctx.device))
        return DenseJacobian.from_wire(tensors)

    def cat(self, parts):
        return (FactoredJacobian if self.path == "factored" else DenseJacobian).cat(parts)

    def pack(self, jac, f: torch.Tensor, y: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], int]:
        """A Jacobian message (J as sent, outputs, labels) and what it would weigh with dense J."""
        n, n_classes = f.shape
        dense = n * n_classes * self.n_params * 4 + f.numel() * 4 + y.numel() * 8
        return (*self.to_wire(jac), f.detach(), y), dense

    def unpack(self, tensors: tuple[torch.Tensor, ...]):
        """pack's tensors -> (Jacobian, outputs, labels), on the run's device."""
        tensors = tuple(t.to(self.ctx.device) for t in tensors)
        return self.from_wire(tensors[:-2]), tensors[-2], tensors[-1]


def tau_histogram(taus: list[int]) -> dict[str, int]:
    """How often each candidate t was chosen (final.json)."""
    return {str(t): taus.count(t) for t in sorted(set(taus))}
