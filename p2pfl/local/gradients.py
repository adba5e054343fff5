"""The gradients of a rank's peers' masked minibatch losses, all peers at once: by hand for MLPs (a
batched backward in closed form) and with torch.func elsewhere, plus MOON's contrastive term."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from p2pfl.models.stack import PeerStack
from p2pfl.seeding import torch_generator
from p2pfl.tasks import Task


@dataclass
class Contrast:
    """MOON's model-contrastive term: mu times the cross-entropy of telling, with cosine similarities
    over a temperature, the global model's representation of a sample (the positive) from the
    client's previous model's (the negative), each row (L, D) the weights of those two models."""

    global_weights: torch.Tensor
    previous: torch.Tensor
    mu: float
    temperature: float

    def rows(self, index) -> "Contrast":
        return Contrast(self.global_weights[index], self.previous[index], self.mu, self.temperature)

    def losses(self, stack: PeerStack, features: torch.Tensor, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(L,): mu times the masked mean contrastive loss of the local features (L, B, E)."""
        with torch.no_grad():
            positive = stack.forward(self.global_weights, x, features=True)[1]
            negative = stack.forward(self.previous, x, features=True)[1]
        logits = (
            torch.stack(
                [F.cosine_similarity(features, positive, dim=-1), F.cosine_similarity(features, negative, dim=-1)], -1
            )
            / self.temperature
        )
        per_sample = torch.logsumexp(logits, -1) - logits[..., 0]
        return self.mu * (per_sample * mask).sum(1) / mask.sum(1).clamp(min=1)


def masked_loss(task: Task, outputs: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The task's mean loss per peer over its unmasked rows: (L, B, out), (L, B), (L, B) -> (L,)."""
    return (task.losses(outputs, y) * mask).sum(1) / mask.sum(1).clamp(min=1)


def gradients(
    stack: PeerStack,
    flat: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    mask: torch.Tensor,
    noise: dict[str, torch.Tensor] | None = None,
    contrast: Contrast | None = None,
    sizes: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-peer gradients of the masked mean loss with respect to the trainable part of each row:
    (L, trainable), and the losses (L,). Batch norm's running statistics in flat are updated in place.

    With batch norm, padded rows would enter the batch statistics, so peers are forwarded in groups of
    equal batch length, each with its real rows only; rows without a batch are not forwarded at all.
    sizes: each row's batch length, on the CPU, where the caller knows it (reading it from a GPU's mask
    would wait for the device)."""
    if hand_written(stack, noise, contrast):
        with one_torch_thread():
            return mlp_gradients(stack, flat, x, y, mask)
    if not stack.couples_samples:
        return _gradients(stack, flat, x, y, mask, noise, contrast)
    sizes = (mask.sum(1) if sizes is None else sizes).long().cpu()
    lengths = set(sizes.tolist())
    if len(lengths) == 1 and 0 not in lengths:  # every row a batch of one length: no groups to gather
        b = lengths.pop()
        part_noise = {k: v[:, : v.shape[1] // x.shape[1] * b] for k, v in (noise or {}).items()}
        return _gradients(stack, flat, x[:, :b], y[:, :b], mask[:, :b], part_noise, contrast)
    grad = torch.zeros(len(flat), stack.layout.trainable, device=flat.device, dtype=flat.dtype)
    losses = torch.zeros(len(flat), device=flat.device, dtype=flat.dtype)
    for b in sorted(set(sizes.tolist()) - {0}):
        rows = to_device((sizes == b).nonzero()[:, 0], flat.device)
        sub = flat[rows]
        part_noise = {k: v[rows, : v.shape[1] // x.shape[1] * b] for k, v in (noise or {}).items()}
        grad[rows], losses[rows] = _gradients(
            stack, sub, x[rows, :b], y[rows, :b], mask[rows, :b], part_noise, contrast.rows(rows) if contrast else None
        )
        flat[rows, stack.layout.trainable :] = sub[:, stack.layout.trainable :]  # the updated running statistics
    return grad, losses


def hand_written(stack: PeerStack, noise=None, contrast=None) -> bool:
    """Whether a step takes mlp_gradients: a batched MLP on a classification task, no extra loss term."""
    return stack.mlp is not None and stack.task.name == "classification" and noise is None and contrast is None


def mlp_gradients(stack, flat, x, y, mask, sgd_lr: float | None = None):
    """_gradients for a batch of MLPs on a classification task, by hand: batched matrix products over
    the peers for the forward pass and backpropagation, instead of vmap of functional_call and autograd
    (several times faster on CPU, where a step of the 784-100-10 MLP is a few small products).

    With sgd_lr, the step itself is taken too (plain SGD: w -= lr * gradient), inside the products that
    make the gradients, and no gradient is returned: this saves writing and re-reading them."""
    shape = stack.mlp
    L, n_layers = len(flat), len(shape.dims)
    acts, gates, a = [], [], x.reshape(L, x.shape[1], -1)
    weights = [flat[:, shape.weights[i]].view(L, *shape.dims[i]) for i in range(n_layers)]
    for i in range(n_layers):
        acts.append(a)
        z = torch.baddbmm(flat[:, None, shape.biases[i]], a, weights[i].transpose(1, 2))
        if i < n_layers - 1:
            gates.append(z > 0)
            a = z.clamp(min=0)
    log_p = torch.log_softmax(z, -1)
    count = mask.sum(1).clamp(min=1)
    losses = -(log_p.gather(-1, y[..., None])[..., 0] * mask).sum(1) / count
    delta = log_p.exp_()
    delta.scatter_add_(-1, y[..., None], torch.full_like(delta[..., :1], -1.0))
    delta.mul_((mask / count[:, None])[..., None])  # d(mean loss)/dz for each peer
    out = None if sgd_lr else torch.empty(L, shape.dense_size(), dtype=flat.dtype, device=flat.device)  # no buffers
    for i in range(n_layers - 1, -1, -1):
        below = torch.bmm(delta, weights[i]).mul_(gates[i - 1]) if i else None  # with the weights before the step
        if sgd_lr:
            weights[i].baddbmm_(delta.transpose(1, 2), acts[i], alpha=-sgd_lr)
            flat[:, shape.biases[i]] -= sgd_lr * delta.sum(1)
        else:
            torch.bmm(delta.transpose(1, 2), acts[i], out=out[:, shape.weights[i]].view(L, *shape.dims[i]))
            out[:, shape.biases[i]] = delta.sum(1)
        delta = below
    return out, losses


def _gradients(stack, flat, x, y, mask, noise, contrast=None):
    """Each parameter is its own leaf (a view of flat): differentiating through slices of one flat leaf
    would make autograd build a zero-filled (L, D) tensor per parameter. Batch norm updates its running
    statistics in place, in copies that are written back to flat."""
    views = stack.layout.views(flat)
    names = list(views)[: stack.layout.n_params]
    leaves = {name: views[name].detach().requires_grad_(True) for name in names}
    buffers = {name: views[name].detach().clone() for name in list(views)[stack.layout.n_params :]}
    outputs = stack.forward_views({**leaves, **buffers}, x, train=True, noise=noise, features=contrast is not None)
    if contrast is not None:
        outputs, features = outputs
    losses = masked_loss(stack.task, outputs, y, mask)
    if contrast is not None:
        losses = losses + contrast.losses(stack, features, x, mask)
    grads = torch.autograd.grad(losses.sum(), list(leaves.values()))
    for name, value in buffers.items():  # vmap updates a contiguous copy in place, not a strided view
        views[name].copy_(value)
    out = torch.empty(len(flat), stack.layout.trainable, dtype=flat.dtype, device=flat.device)
    for slot, g in zip(stack.layout.slots, grads):  # one copy each (grads may be strided)
        out[:, slot.offset : slot.offset + slot.numel].view(g.shape).copy_(g)
    return out, losses.detach()


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """t (on the CPU) on device, without waiting for the device: through pinned memory to a GPU (a plain
    copy from pageable memory waits for the device's queue to drain, one stall per step)."""
    device = torch.device(device)
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


@contextmanager
def one_torch_thread():
    """torch splits a small matrix product over its threads in a way that rounds differently with what
    else is in the batch: the hand-written MLP products run on one torch thread each (blocks of peers
    spread over the cores instead), so that each peer's arithmetic is the same whatever shares its
    batch, and so on any number of ranks."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@dataclass(frozen=True)
class PrivateStep:
    """DP-SGD's step (Abadi et al. 2016) for a block of peers: each sample's gradient clipped to clip in
    2-norm, summed, Gaussian noise of standard deviation noise * clip added, divided by the batch size.
    keys: (seed, purpose indices...) of each row's noise, drawn on the CPU from a generator keyed by them
    (the same on every layout and device)."""

    clip: float
    noise: float
    batch: int
    keys: list[tuple]


def private_gradients(
    stack: PeerStack, flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, step: PrivateStep
) -> tuple[torch.Tensor, torch.Tensor]:
    """(L, trainable) DP-SGD gradients and the (L,) masked mean losses. A peer at a time, each of its samples
    a row of its own (the peer's weights repeated), so the batched gradient gives per-sample gradients; a
    peer at a time so that every product has the same shape on every layout of the peers (a block's
    size would change how the products round)."""
    peers, batch = mask.shape
    out = torch.zeros(peers, stack.layout.trainable, device=flat.device, dtype=flat.dtype)
    losses = torch.zeros(peers, device=flat.device, dtype=flat.dtype)
    for i in range(peers):
        rows = flat[i : i + 1].expand(batch, -1).contiguous()
        grad, loss = gradients(stack, rows, x[i][:, None], y[i][:, None], mask[i][:, None])
        norms = grad.norm(dim=1, keepdim=True)
        grad.mul_((step.clip / (norms + 1e-6)).clamp(max=1.0)).mul_(mask[i][:, None])
        noise = torch.randn(grad.shape[1], generator=torch_generator(*step.keys[i]), dtype=torch.float32)
        out[i] = (grad.sum(0) + noise.to(grad.device) * (step.noise * step.clip)) / step.batch
        losses[i] = (loss * mask[i]).sum() / mask[i].sum().clamp(min=1)
    return out, losses
