"""TCT's convexified network (Yu et al. 2022, sec. 4.1 and Alg. 3): the trained network with its last
layer replaced by a fresh one-logit head, and each sample represented by the gradient of that logit
with respect to every trainable parameter, on a fixed random subset of p coordinates."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from p2pfl.models import ParamLayout, build_model
from p2pfl.seeding import torch_generator


def one_logit_network(
    model_name: str, input_shape, options, trained: torch.Tensor, n_classes: int, seed: int
) -> tuple[nn.Module, ParamLayout, torch.Tensor]:
    """The network of `trained` (a flat C-output model) with its head swapped for a Linear(E, 1) drawn
    from `seed` (PyTorch's default Linear law, U(-1/sqrt(E), 1/sqrt(E))): the same on every client."""
    full = ParamLayout(build_model(model_name, input_shape, n_classes, options))
    model = build_model(model_name, input_shape, 1, options).to(trained.device)
    layout = ParamLayout(model)
    source = full.views(trained)
    gen = torch_generator(seed, "tct-head")
    flat = torch.empty(layout.size, device=trained.device)
    head_in = None
    for slot in layout.slots:  # the head is where the shapes differ: (1, E) weight and (1,) bias
        if slot.shape == tuple(source[slot.name].shape):
            flat[slot.offset : slot.offset + slot.numel] = source[slot.name].reshape(-1)
            continue
        head_in = slot.shape[-1] if len(slot.shape) == 2 else head_in
        bound = 1 / math.sqrt(head_in or 1)
        draw = (torch.rand(slot.numel, generator=gen) * 2 - 1) * bound
        flat[slot.offset : slot.offset + slot.numel] = draw.to(trained.device)
    return model, layout, flat


def subsample_index(total: int, keep: int, seed: int) -> torch.Tensor:
    """Alg. 3's coordinate subset: the first `keep` entries of a random permutation of the `total`
    parameter indices, drawn after seeding with `seed` (all of them, in order, when keep >= total)."""
    if keep >= total:
        return torch.arange(total)
    return torch.randperm(total, generator=torch.Generator().manual_seed(seed))[:keep]


def entk_features(
    model: nn.Module,
    layout: ParamLayout,
    flat: torch.Tensor,
    x: torch.Tensor,
    index: torch.Tensor,
    memory_gb: float = 2.0,
    done=None,
) -> torch.Tensor:
    """(n, len(index)) float16: per-sample gradients of the single logit with respect to the trainable
    parameters, flattened in parameter order (torch.func: vmap of grad), evaluation mode with batch
    norm on its running statistics, in chunks whose (chunk, P) float32 gradients fit in memory_gb.
    done(k), where given, hears of every chunk of k samples finished (a progress bar)."""
    model.eval()
    views = layout.views(flat)
    params = {s.name: views[s.name] for s in layout.slots[: layout.n_params]}
    buffers = {s.name: views[s.name] for s in layout.slots[layout.n_params :]}

    def logit(p, xi):
        return functional_call(model, {**p, **buffers}, (xi[None],))[0, 0]

    per_sample = vmap(grad(logit), in_dims=(None, 0))
    chunk = max(1, min(256, int(memory_gb * 2**30 / (3 * 4 * layout.trainable))))
    index = index.to(flat.device)
    out = torch.empty(len(x), len(index), dtype=torch.float16, device=flat.device)
    for s in range(0, len(x), chunk):
        grads = per_sample(params, x[s : s + chunk])
        rows = torch.cat([grads[name].reshape(len(grads[name]), -1) for name in params], 1)
        out[s : s + chunk] = rows[:, index].to(torch.float16)
        if done is not None:
            done(len(rows))
    return out
