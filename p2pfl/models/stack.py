"""The peers of one rank as one flat (peers, state) tensor, evaluated as one vmap batch.

A flat layout makes messages, averaging and gathers single tensors, and lets a rank's peers train as
one batch: functional_call + vmap over the stacked parameters (DESIGN, "a rank's peers are one batch").
A row holds the trainable parameters first, then the float buffers (batch norm's running statistics):
buffers travel and are averaged with the weights, and are counted in bytes, but SGD never steps them.
"""

from __future__ import annotations

import copy
import threading

import torch
from torch import nn
from torch.func import functional_call, vmap

from p2pfl.errors import UserError
from p2pfl.models.layers import PeerDropout
from p2pfl.models.layout import ParamLayout
from p2pfl.models.mlp import MLP, MLPShape
from p2pfl.seeding import keyed_uniform, torch_generator
from p2pfl.tasks import TASKS, Task


class PeerStack:
    """Forward passes of many peers' models that share one architecture."""

    def __init__(self, model: nn.Module, batched: bool = True, task: Task = TASKS["classification"]):
        self.model = model
        # the run's device: where the model sits, and so every tensor its forward passes take
        self.device = next(iter([*model.parameters(), *model.buffers()]), torch.zeros(0)).device
        self.task = task  # what the outputs mean: the loss and metrics training and evaluation use
        self.layout = ParamLayout(model)
        # vmap turns a convolution with per-peer weights into a grouped convolution: on CPU it was 3.4x
        # slower than one peer at a time (bench/bench_cnn.py), and its rounding depends on the number of
        # groups, i.e. on how many peers a rank holds. Conv nets therefore run one peer at a time on the
        # CPU; on a GPU, where vmap measured 3.8x faster than the loop, as one batch.
        self.convolutional = any(isinstance(m, nn.Conv2d) for m in model.modules())
        self.batched = batched and (not self.convolutional or self.device.type != "cpu")
        self._activations: dict[tuple[int, ...], int] = {}
        # on a GPU, the part of its free memory this rank's batches may take (the run divides it among the
        # ranks that share the GPU)
        self.memory_share = 0.5
        self.dropouts = {name: m for name, m in model.named_modules() if isinstance(m, PeerDropout)}
        drawing = [name for name, m in model.named_modules() if isinstance(m, nn.modules.dropout._DropoutNd)]
        if drawing and self.batched:
            raise UserError(
                f"the model's layer {drawing[0]!r} ({type(dict(model.named_modules())[drawing[0]]).__name__}) draws "
                "random numbers, which one batch of peers (vmap) cannot: run with --no-batch, or use "
                "p2pfl.models.layers.PeerDropout (keyed per peer, batched)"
            )
        # a batched MLP trains through hand-written batched products (p2pfl.local.gradients.mlp_gradients)
        self.mlp = _mlp_shape(model, self.layout) if self.batched else None
        self._scratch = threading.local()  # freed with its thread
        # batch norm couples the samples of a batch: padded rows must not enter its statistics
        self.couples_samples = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())

    def forward(
        self, flat: torch.Tensor, x: torch.Tensor, shared_input: bool = False, features: bool = False
    ) -> torch.Tensor:
        """Evaluation: flat (L, D); x (L, B, ...) or, with shared_input, (B, ...) -> (L, B, outputs);
        with features, also the representation (L, B, E)."""
        return self.forward_views(self.layout.views(flat), x, shared_input, features=features)

    def forward_views(
        self,
        params: dict[str, torch.Tensor],
        x: torch.Tensor,
        shared_input: bool = False,
        train: bool = False,
        noise: dict[str, torch.Tensor] | None = None,
        features: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """As forward, from named (L, ...) tensors; train=True uses batch statistics (and updates the
        running ones in place) and the given dropout noise. features=True also returns the model's
        representation: the input of its last Linear layer (the penultimate layer's output)."""
        self.model.train(train)
        params = {**params, **(noise or {})}
        call = lambda p, xb: functional_call(self.model, p, (xb,))  # noqa: E731
        if features:
            call = self._with_features
        if self.batched:
            try:
                return vmap(call, in_dims=(0, None if shared_input else 0))(params, x)
            except RuntimeError as exc:
                if "random" not in str(exc):
                    raise
                raise UserError(
                    "the model draws random numbers in its forward pass, which one batch of peers (vmap) cannot: "
                    "run with --no-batch"
                ) from None
        rows = next(iter(params.values())).shape[0]
        out = [call({k: v[i] for k, v in params.items()}, x if shared_input else x[i]) for i in range(rows)]
        return tuple(torch.stack(part) for part in zip(*out)) if features else torch.stack(out)

    def scratch(self, name: str, size: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        """A reusable tensor of this size: a step's large temporaries (tens of MB at 300 peers) would
        otherwise be fresh memory every step, and the first touch of fresh pages costs more than the
        arithmetic. Whoever asks owns its contents until its thread's next request of the same name."""
        mine = self._scratch.__dict__  # per thread: threads training different blocks each have their own
        held = mine.get(name)
        if held is None or held.shape != size or held.dtype != like.dtype or held.device != like.device:
            held = mine[name] = torch.empty(size, dtype=like.dtype, device=like.device)
        return held

    def batch_budget(self) -> int:
        """Bytes this rank's batches may take on its device now: its share of the GPU's free memory (a
        device without a free-memory query counts as 16 GiB)."""
        free = torch.cuda.mem_get_info(self.device)[0] if self.device.type == "cuda" else 16 * 2**30
        return int(free * self.memory_share)

    def activation_bytes(self, sample_shape: tuple[int, ...]) -> int:
        """About what one training sample's forward and backward pass hold: three times the outputs of
        every module on it (kept for the backward pass, their gradients, slack), measured once per input
        shape by a forward pass of one sample."""
        if sample_shape not in self._activations:
            sizes = []
            hooks = [
                m.register_forward_hook(
                    lambda module, inputs, output: sizes.append(
                        output.numel() * output.element_size() if isinstance(output, torch.Tensor) else 0
                    )
                )
                for m in self.model.modules()
                if m is not self.model
            ]
            try:
                with torch.no_grad():
                    self.model.eval()(torch.zeros(1, *sample_shape, device=self.device))
            finally:
                for hook in hooks:
                    hook.remove()
            self._activations[sample_shape] = 3 * sum(sizes) + 1
        return self._activations[sample_shape]

    def _with_features(self, params, x):
        """(outputs, the last Linear layer's input), taken by a hook inside the (vmapped) call."""
        last = [m for m in self.model.modules() if isinstance(m, nn.Linear)][-1]
        seen = []
        hook = last.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0]))
        try:
            outputs = functional_call(self.model, params, (x,))
        finally:
            hook.remove()
        return outputs, seen[0]

    def dropout_noise(self, keys: torch.Tensor, batch: int, *counters: int) -> dict[str, torch.Tensor]:
        """Uniform draws (L, batch * features) for every dropout layer, on the device where keys are:
        row i keyed by keys[i] (the peer's, p2pfl.seeding.peer_keys), the counters (the step) and the
        layer, so each peer's mask is its own whatever shares the batch, on every layout and device."""
        return {
            f"{name}.noise": keyed_uniform(keys, batch * layer.features, *counters, j)
            for j, (name, layer) in enumerate(self.dropouts.items())
        }


def _mlp_shape(model: nn.Module, layout: ParamLayout):
    return MLPShape.of(model, layout) if isinstance(model, MLP) else None


def reset_model(model: nn.Module, gen: torch.Generator) -> None:
    """Deterministic initialisation from gen: the model's own reset() where it has one, else Kaiming-
    normal (fan-in, gain sqrt 2) weights of conv and linear layers with zero biases (the NTK-DFL/NTK-FL
    code's MLP init), unit scale and zero shift for norm layers, fresh running statistics."""
    if hasattr(model, "reset"):
        model.reset(gen)
        return
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                nn.init.kaiming_normal_(module.weight, a=0.0, mode="fan_in", generator=gen)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, (nn.modules.batchnorm._BatchNorm, nn.GroupNorm)):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.reset_running_stats()


def initial_parameters(model: nn.Module, peers: list[int], seed: int, init: str, device: torch.device) -> torch.Tensor:
    """(len(peers), D) on device: one shared initial model ('same') or one per peer ('different').
    Drawn on a CPU copy of the model, from the keyed CPU generators, whatever device the model is on:
    the same initial weights on every device and layout."""
    layout = ParamLayout(model)
    model = copy.deepcopy(model).to("cpu")
    rows = []
    for peer in peers:
        reset_model(model, torch_generator(seed, "init", 0 if init == "same" else peer))
        rows.append(layout.flatten(model))
    return torch.stack(rows).to(device) if rows else torch.zeros(0, layout.size, device=device)
