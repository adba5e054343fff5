"""Per-sample Jacobians of a model's outputs, in two interchangeable forms.

DenseJacobian holds J (n, C, D) from torch.func: any model, and the form compression acts on.

FactoredJacobian is exact for MLPs (Linear layers with elementwise activations). For layer l the
Jacobian of output c is an outer product, dF_c/dW_l = delta_{l,c} a_{l-1}^T, and the backprop signal
delta is fixed by the weights and the activation derivatives sigma'(z_l). So a sample is encoded by
its layer inputs a_0..a_{L-1} and its derivatives sigma'(z_1)..sigma'(z_{L-1}); whoever holds the
weights the Jacobian was taken at (in NTK-DFL: the receiver, whose own averaged weights they are)
rebuilds every kernel entry and J^T r exactly, in O(N^2 (d_in + width)) instead of O(N^2 C D).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, jacrev, vmap

from p2pfl.models.mlp import MLPShape
from p2pfl.models.layout import ParamLayout
from p2pfl.ntk.pixels import PixelInputs


@dataclass
class FactoredJacobian:
    acts: list[torch.Tensor]  # inputs of each Linear layer: (n, in_l)
    gates: list[torch.Tensor]  # sigma'(z_l) of each hidden layer: (n, out_l)
    # the row counts of the Jacobians this one was stacked from (cat), and the Gram a_0 a_0^T of each one's
    # inputs where the caller knows it (None where not): the kernel takes its products block by block
    blocks: tuple[int, ...] = ()
    input_grams: tuple[torch.Tensor | None, ...] = ()
    # the inputs a_0 as 8-bit pixel codes, where they are pixels: the products with them are then exact
    # integer ones (p2pfl.ntk.pixels), and the kernel takes its inputs Gram from them
    pixels: PixelInputs | None = None

    @property
    def n(self) -> int:
        return self.acts[0].shape[0]

    @staticmethod
    def compute(shape: MLPShape, flat: torch.Tensor, x: torch.Tensor) -> tuple["FactoredJacobian", torch.Tensor]:
        """The factors of f(x; flat) and the outputs f (n, C): a forward pass, no backward needed."""
        acts, gates, a = [], [], x.reshape(len(x), -1)
        for layer in range(len(shape.dims)):
            acts.append(a)
            z = a @ shape.weight(flat, layer).T + flat[shape.biases[layer]]
            if layer < len(shape.dims) - 1:
                gates.append((z > 0).to(z.dtype))
                a = torch.relu(z)
        return FactoredJacobian(acts, gates), z

    @staticmethod
    def compute_many(
        shape: MLPShape, flats: torch.Tensor, x: torch.Tensor
    ) -> list[tuple["FactoredJacobian", torch.Tensor]]:
        """compute at each of the weights flats (K, D) on the same inputs, as batched products (a GPU's few
        operations for a sender's K Jacobians instead of K times a forward pass); the factors are views."""
        K, a = len(flats), x.reshape(len(x), -1)
        acts, gates, h = [], [], a
        for layer, (out, inputs) in enumerate(shape.dims):
            W = flats[:, shape.weights[layer]].view(K, out, inputs)
            z = torch.matmul(h, W.transpose(1, 2)).add_(flats[:, shape.biases[layer]][:, None, :])
            if layer < len(shape.dims) - 1:
                gates.append((z > 0).to(z.dtype))
                h = torch.relu(z)
                acts.append(h)
        return [(FactoredJacobian([a, *(act[k] for act in acts)], [g[k] for g in gates]), z[k]) for k in range(K)]

    def signals(self, shape: MLPShape, flat: torch.Tensor, layer: int) -> torch.Tensor:
        """delta_l (n, C, out_l) = d f / d z_l, rebuilt from the gates and the weights."""
        n, C = self.n, shape.n_classes
        delta = torch.eye(C, dtype=self.acts[0].dtype, device=self.acts[0].device).expand(n, C, C)
        for l in range(len(shape.dims) - 1, layer, -1):
            delta = (delta @ shape.weight(flat, l)) * self.gates[l - 1][:, None, :]
        return delta

    def dense(self, shape: MLPShape, flat: torch.Tensor) -> torch.Tensor:
        """The dense per-sample Jacobians (n, C, D) over the trainable parameters: delta_l a_{l-1}^T for
        each layer's weights and delta_l for its bias (differentiable in the factors' inputs)."""
        n, C = self.n, shape.n_classes
        D = max(s.stop for s in (*shape.weights, *shape.biases))
        out = torch.zeros(n, C, D, dtype=self.acts[0].dtype, device=self.acts[0].device)
        for layer in range(len(shape.dims)):
            delta = self.signals(shape, flat, layer)  # (n, C, out_l)
            out[:, :, shape.weights[layer]] = (delta[..., None] * self.acts[layer][:, None, None, :]).reshape(n, C, -1)
            out[:, :, shape.biases[layer]] = delta
        return out

    def kernel(self, shape: MLPShape, flat: torch.Tensor) -> torch.Tensor:
        """H_mn = (1/C) sum_c <J_c(x_m), J_c(x_n)>, summed layer by layer from the factors: each layer's
        (inputs Gram + 1) times its backprop signals' Gram. H is symmetric, so only the upper block
        triangle is computed, a panel per stacked block (each block's rows against its own and the later
        blocks' columns: 21 of the 36 block products of six blocks), and mirrored. The inputs Gram, the
        largest product (the data's dimension), comes from the pixels where known, else a block's own
        from input_grams where given."""
        L, C, n = len(shape.dims), shape.n_classes, self.n
        signals = []  # per layer, the (n, k) rows whose Gram is the layer's signal factor (None: the last)
        for layer in range(L):
            if layer == L - 2:
                # delta_{L-1}[c] = W_L[c] * gate, so sum_c <delta_m[c], delta_n[c]> = gate_m diag(s) gate_n
                signals.append(self.gates[layer] * ((shape.weight(flat, L - 1) ** 2).sum(0) / C).sqrt())
            elif layer < L - 2:
                signals.append(self.signals(shape, flat, layer).reshape(n, -1) / math.sqrt(C))
            else:  # the last layer: delta_L is the identity, sum_c <e_c, e_c> = C, divided by C
                signals.append(None)
        blocks = self.blocks or (n,)
        grams = self.input_grams or (None,) * len(blocks)
        H = torch.empty(n, n, dtype=self.acts[0].dtype, device=self.acts[0].device)
        start = 0
        for size, gram in zip(blocks, grams):
            end = start + size
            panel = H[start:end, start:]
            for layer in range(L):
                rows, cols = self.acts[layer][start:end], self.acts[layer][start:]
                if layer == 0 and self.pixels is not None:
                    term = self.pixels.gram(start, end).add_(1.0)  # + 1: the bias
                else:
                    if layer == 0 and gram is not None:
                        term = torch.empty_like(panel)
                        term[:, :size] = gram
                        torch.matmul(rows, self.acts[0][end:].T, out=term[:, size:])
                    else:
                        term = rows @ cols.T
                    term += 1.0  # the bias
                if signals[layer] is not None:
                    term *= signals[layer][start:end] @ signals[layer][start:].T
                if layer:
                    panel += term
                else:
                    panel.copy_(term)
            H[end:, start:end] = H[start:end, end:].T
            start = end
        return H

    def input_gram(self) -> torch.Tensor:
        """a_0 a_0^T: the Gram of the inputs, which does not depend on the weights (reusable)."""
        return self.acts[0] @ self.acts[0].T

    def transpose_apply(self, shape: MLPShape, flat: torch.Tensor, R: torch.Tensor) -> torch.Tensor:
        """sum_{m,c} R[t,m,c] dF_c(x_m)/dw for each t: R (T, n, C) -> (T, D), by backprop of R."""
        out = torch.zeros(R.shape[0], flat.shape[0], dtype=R.dtype, device=R.device)
        g = R
        for layer in range(len(shape.dims) - 1, -1, -1):
            if layer == 0 and self.pixels is not None:
                rows = g.transpose(1, 2).reshape(-1, self.n)  # (T out_0, n)
                out[:, shape.weights[0]] = self.pixels.left(rows).reshape(len(R), -1)
            else:
                out[:, shape.weights[layer]] = (g.transpose(1, 2) @ self.acts[layer]).reshape(len(R), -1)
            out[:, shape.biases[layer]] = g.sum(1)
            if layer:
                g = (g @ shape.weight(flat, layer)) * self.gates[layer - 1]
        return out

    def rows(self, index: torch.Tensor) -> "FactoredJacobian":
        return FactoredJacobian(
            [a[index] for a in self.acts],
            [g[index] for g in self.gates],
            pixels=None if self.pixels is None else self.pixels.rows(index),
        )

    def to_wire(self) -> tuple[torch.Tensor, ...]:
        """ReLU gates are 0/1: sent as bytes, not floats."""
        return (*self.acts, *(g.to(torch.uint8) for g in self.gates))

    @staticmethod
    def from_wire(tensors: tuple[torch.Tensor, ...], dtype=torch.float32) -> "FactoredJacobian":
        n_layers = (len(tensors) + 1) // 2
        return FactoredJacobian([t.to(dtype) for t in tensors[:n_layers]], [t.to(dtype) for t in tensors[n_layers:]])

    @staticmethod
    def cat(
        parts: list["FactoredJacobian"],
        input_grams: list[torch.Tensor | None] | None = None,
        pixels: PixelInputs | None = None,
    ) -> "FactoredJacobian":
        """The parts stacked, as blocks of the kernel; input_grams: each part's input_gram() where known;
        pixels: the stacked inputs' pixel codes where they are pixels."""
        return FactoredJacobian(
            [torch.cat(a) for a in zip(*(p.acts for p in parts))],
            [torch.cat(g) for g in zip(*(p.gates for p in parts))],
            tuple(p.n for p in parts),
            tuple(input_grams or [None] * len(parts)),
            pixels,
        )


def sample_function(model: nn.Module, layout: ParamLayout, flat: torch.Tensor):
    """(f, w): f(w, x) is the model's output for one sample x as a function of its trainable parameters
    w (flat), in evaluation mode with the state buffers of flat held fixed; w is flat's trainable part."""
    model.eval()
    buffers = {k: v.detach() for k, v in list(layout.views(flat).items())[layout.n_params :]}
    params = layout.slots[: layout.n_params]

    def f(w, xi):
        named = {s.name: w[s.offset : s.offset + s.numel].view(s.shape) for s in params}
        return functional_call(model, {**named, **buffers}, (xi[None],))[0]

    return f, flat[: layout.trainable]


@dataclass
class DenseJacobian:
    J: torch.Tensor  # (n, C, D)

    @property
    def n(self) -> int:
        return self.J.shape[0]

    @staticmethod
    def compute(
        model: nn.Module, layout: ParamLayout, flat: torch.Tensor, x: torch.Tensor, chunk: int = 50
    ) -> tuple["DenseJacobian", torch.Tensor]:
        """Per-sample Jacobians with respect to the trainable parameters (torch.func, vmap of jacrev),
        chunk samples at a time, in evaluation mode (batch norm on its running statistics, no dropout)."""
        f, w = sample_function(model, layout, flat)
        jac = vmap(jacrev(f), in_dims=(None, 0))
        out = vmap(f, in_dims=(None, 0))
        parts = [
            (jac(w, x[s : s + chunk]).detach(), out(w, x[s : s + chunk]).detach()) for s in range(0, len(x), chunk)
        ]
        return DenseJacobian(torch.cat([j for j, _ in parts])), torch.cat([o for _, o in parts])

    def kernel(self, shape=None, flat=None) -> torch.Tensor:
        C = self.J.shape[1]
        flatJ = self.J.reshape(self.n, -1)
        return flatJ @ flatJ.T / C

    def transpose_apply(self, shape, flat, R: torch.Tensor) -> torch.Tensor:
        """(T, D): J^T R over the trainable parameters, zero for state buffers."""
        out = torch.zeros(R.shape[0], flat.shape[-1], dtype=R.dtype, device=R.device)
        out[:, : self.J.shape[2]] = torch.einsum("tnc,ncd->td", R, self.J)
        return out

    def rows(self, index: torch.Tensor) -> "DenseJacobian":
        return DenseJacobian(self.J[index])

    def to_wire(self) -> tuple[torch.Tensor, ...]:
        return (self.J,)

    @staticmethod
    def from_wire(tensors, dtype=torch.float32) -> "DenseJacobian":
        return DenseJacobian(tensors[0].to(dtype))

    @staticmethod
    def cat(parts: list["DenseJacobian"]) -> "DenseJacobian":
        return DenseJacobian(torch.cat([p.J for p in parts]))
