"""A chunk of NTK-DFL neighbourhoods as one batch of padded tensors: the GPU's NTK step for factored (MLP)
Jacobians, in a few hundred operations for the whole chunk instead of about 130 per peer.

A GPU round is bound by the host issuing its operations (8-12 us each), not by their arithmetic: the
per-problem step (p2pfl.ntk.step.ntk_steps) issues about 130 operations a peer outside the evolution. Here
every member's factors, outputs and labels are gathered into (B, N, .) tensors padded with zero rows, and
the kernel, the evolution (one integration loop, p2pfl.ntk.batched_evolution), the candidates' weights and
their selection are each a few batched products. The arithmetic is the per-problem step's (the inputs Gram
as a float product, as a GPU takes it); a padded sample has a zero kernel row and no weight in any loss."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from p2pfl.models.mlp import MLPShape
from p2pfl.ntk import batched_evolution
from p2pfl.ntk.step import StepBatch, select_t


@dataclass
class HoodBatch:
    acts: list[torch.Tensor]  # per layer, its inputs (B, N, in_l), zero rows past a neighbourhood's size
    gates: list[torch.Tensor]  # per hidden layer, sigma'(z) (B, N, out_l)
    f0: torch.Tensor  # (B, N, C) the outputs the Jacobians were taken with
    labels: torch.Tensor  # (B, N)
    valid: torch.Tensor  # (B, N) 1.0 for a sample, 0.0 for padding
    select: torch.Tensor  # (B, N) 1.0 for the samples each peer selects its t on
    w: torch.Tensor  # (B, D) the weights each neighbourhood's Jacobians were taken at
    sizes: list[int]

    @staticmethod
    def gather(
        hoods: list[list[tuple]], own: list[int], w: torch.Tensor, layers: int, own_only: bool = False
    ) -> "HoodBatch":
        """hoods[b]: the members' (wire tensors of a factored Jacobian: acts then uint8 gates, outputs,
        labels) in order, on w's device; own[b]: which member is the peer itself; own_only: each peer
        selects its t on its own samples, else on its neighbourhood's. Each factor is one concatenation of
        every member's rows and one gather by a padded index."""
        parts = [part for hood in hoods for part in hood]
        sizes = [sum(len(p[2]) for p in hood) for hood in hoods]
        B, N = len(hoods), max(sizes)
        total = sum(sizes)
        index = torch.full((B, N), total, dtype=torch.long)  # padding reads the zero row appended below
        select = torch.zeros(B, N)
        start = 0
        for b, hood in enumerate(hoods):
            at = 0
            for m, (_, _, y) in enumerate(hood):
                index[b, at : at + len(y)] = torch.arange(start, start + len(y))
                if m == own[b]:
                    select[b, at : at + len(y)] = 1.0
                at += len(y)
                start += len(y)
        device = w.device
        index, select = index.to(device), select.to(device)

        def stacked(tensors: list[torch.Tensor]) -> torch.Tensor:
            zero = tensors[0].new_zeros((1, *tensors[0].shape[1:]))
            return torch.cat([*tensors, zero])[index]

        wires = [p[0] for p in parts]
        acts = [stacked([wire[layer] for wire in wires]) for layer in range(layers)]
        gates = [stacked([wire[layers + layer] for wire in wires]).float() for layer in range(layers - 1)]
        valid = (index < total).float()
        f0, labels = stacked([p[1] for p in parts]), stacked([p[2] for p in parts])
        return HoodBatch(acts, gates, f0, labels, valid, select if own_only else valid, w, sizes)

    def kernels(self, shape: MLPShape) -> torch.Tensor:
        """(B, N, N): each neighbourhood's H = (1/C) sum_c J_c J_c^T layer by layer, as FactoredJacobian.kernel
        (each layer's inputs Gram plus the bias's ones, times its backprop signals' Gram), zero on padding."""
        L, C, B = len(shape.dims), shape.n_classes, len(self.sizes)
        ones = self.valid[:, :, None] * self.valid[:, None, :]  # the bias's term, on real samples only
        H = None
        for layer in range(L):
            term = torch.baddbmm(ones, self.acts[layer], self.acts[layer].transpose(1, 2))
            if layer == L - 2:  # delta_{L-1}[c] = W_L[c] * gate: sum_c <., .> = gate_m diag(s) gate_n
                s = (self._weight(shape, L - 1, B).pow(2).sum(1) / C).sqrt()
                signal = self.gates[layer] * s[:, None, :]
            elif layer < L - 2:
                signal = self._signals(shape, layer).flatten(2) / math.sqrt(C)
            else:
                signal = None  # the last layer: sum_c <e_c, e_c> / C = 1
            if signal is not None:
                term.mul_(torch.bmm(signal, signal.transpose(1, 2)))
            H = term if H is None else H.add_(term)
        return H

    def _weight(self, shape: MLPShape, layer: int, B: int) -> torch.Tensor:
        return self.w[:, shape.weights[layer]].view(B, *shape.dims[layer])

    def _signals(self, shape: MLPShape, layer: int) -> torch.Tensor:
        """delta_layer (B, N, C, out_layer), from the gates and each peer's weights."""
        B, N = self.acts[0].shape[:2]
        C = shape.n_classes
        delta = torch.eye(C, device=self.w.device).expand(B, N, C, C)
        for later in range(len(shape.dims) - 1, layer, -1):
            delta = (delta @ self._weight(shape, later, B)[:, None]) * self.gates[later - 1][:, :, None, :]
        return delta

    def transpose_apply(self, shape: MLPShape, R: torch.Tensor) -> torch.Tensor:
        """(B, T, D): sum_{m,c} R[b,t,m,c] dF_c(x_m)/dw for R (B, T, N, C), by backprop of R through each
        peer's weights (FactoredJacobian.transpose_apply, batched)."""
        B, T = R.shape[:2]
        out = R.new_zeros(B, T, self.w.shape[1])
        g = R
        for layer in range(len(shape.dims) - 1, -1, -1):
            out[:, :, shape.weights[layer]] = (g.transpose(2, 3) @ self.acts[layer][:, None]).flatten(2)
            out[:, :, shape.biases[layer]] = g.sum(2)
            if layer:
                g = (g @ self._weight(shape, layer, B)[:, None]) * self.gates[layer - 1][:, None]
        return out

    def network_losses(self, shape: MLPShape, candidates: torch.Tensor) -> torch.Tensor:
        """(B, T): each candidate network's cross-entropy on its peer's selection samples (the inputs are
        the first layer's factors), a mean over them."""
        B, T = candidates.shape[:2]
        z = self.acts[0][:, None]  # (B, 1, N, in): every candidate of a peer on the same inputs
        for layer, (out, inputs) in enumerate(shape.dims):
            W = candidates[:, :, shape.weights[layer]].view(B, T, out, inputs)
            z = torch.matmul(z.clamp(min=0) if layer else z, W.transpose(2, 3))
            z = z.add_(candidates[:, :, shape.biases[layer]][:, :, None, :])
        picked = torch.log_softmax(z, -1).gather(-1, self.labels[:, None, :, None].expand(B, T, -1, 1))[..., 0]
        return -(picked * self.select[:, None]).sum(-1) / self.select.sum(-1)[:, None]

    def targets(self, n_classes: int) -> torch.Tensor:
        """One-hot labels (B, N, C), zero rows on padding; by a scatter, which (unlike one_hot's range check)
        does not wait for the device."""
        Y = torch.zeros(*self.labels.shape, n_classes, device=self.labels.device)
        return Y.scatter_(2, self.labels[..., None], self.valid[..., None])

    def linearized_losses(self, outputs: torch.Tensor) -> torch.Tensor:
        """(B, T): the cross-entropy of the evolved outputs f_t (T, B, N, C) on the neighbourhood's samples
        (evolution.linearized_loss, batched)."""
        Y = self.targets(outputs.shape[-1])
        per_sample = -(torch.log_softmax(outputs, -1) * Y).sum(-1)  # (T, B, N)
        return (per_sample.sum(-1) / self.valid.sum(-1)).T


def batched_steps(batch: HoodBatch, shape: MLPShape, eta: float, settings) -> StepBatch:
    """ntk_steps for a chunk of neighbourhoods at once: kernels, one evolution loop, every candidate's
    weights, the selection (settings.selection: network on the neighbourhood, own on the peer's samples,
    linearized on the evolved outputs) and the chosen t, with one wait for the device (the t's)."""
    Y = batch.targets(shape.n_classes)
    taus = list(settings.taus)
    sums, outputs, rates = batched_evolution.evolve_padded(
        batch.kernels(shape), batch.f0.float(), Y, batch.sizes, eta, taus, euler=settings.ode != "split"
    )
    scale = torch.tensor(rates, device=batch.w.device)[:, None, None]
    sums = sums.transpose(0, 1).mul_(batch.valid[:, None, :, None])  # a padded sample's residual is no term
    candidates = batch.w[:, None] - scale * batch.transpose_apply(shape, sums)
    # network: the selection mask is the neighbourhood's samples; own: the peer's
    losses, best = select_t(
        settings.selection, lambda: batch.linearized_losses(outputs), lambda: batch.network_losses(shape, candidates)
    )
    chosen = candidates[torch.arange(len(best), device=best.device), best]
    return StepBatch(chosen, [taus[b] for b in best.tolist()], losses)
