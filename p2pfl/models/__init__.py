"""Models by name, and the stacked (peers x parameters) representation they are trained in; a step's FLOPs
(flops.py) for the virtual clock."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from p2pfl.errors import UserError

from p2pfl.models.cnn import CNNCifar, CNNFashionMNIST, CNNFEMNIST, LeNet5, SimpleCNN
from p2pfl.models.linear_rep import LinearRepresentation
from p2pfl.models.mlp import MLP, MLPShape
from p2pfl.models.resnet import resnet8, resnet18
from p2pfl.models.layout import ParamLayout
from p2pfl.models.stack import PeerStack, initial_parameters, reset_model
from p2pfl.plugins import call_plugin, is_reference, load_object


@dataclass(frozen=True)
class ModelSpec:
    name: str
    summary: str
    build: Callable[..., nn.Module]  # (input_shape, n_outputs, options) -> module
    task: str = "classification"
    images: bool = True  # needs (C, H, W) inputs


MODELS = {
    s.name: s
    for s in [
        ModelSpec(
            "mlp",
            "the papers' MLP, --hidden widths (784-100-10 by default)",
            lambda shape, n, o: MLP(math.prod(shape), o.hidden, n),
            images=False,
        ),
        ModelSpec(
            "logistic",
            "multinomial logistic regression: one linear layer (the convex model of CHOCO-SGD's and gradient "
            "tracking's experiments)",
            lambda shape, n, o: MLP(math.prod(shape), [], n),
            images=False,
        ),
        ModelSpec("simple-cnn", "TCT's FMNIST net: 2 conv+pool, 2 FC", lambda shape, n, o: SimpleCNN(shape, n)),
        ModelSpec(
            "cnn-fmnist", "CyclicFL's CNN-FMNIST: 2 conv, dropout, 2 FC", lambda shape, n, o: CNNFashionMNIST(shape, n)
        ),
        ModelSpec("cnn-femnist", "CyclicFL's CNN-FEMNIST: 2 conv, 1 FC", lambda shape, n, o: CNNFEMNIST(shape, n)),
        ModelSpec("lenet5", "LeNet-5: 2 conv, 3 FC", lambda shape, n, o: LeNet5(shape, n)),
        ModelSpec("resnet8", "ResNet-8, CIFAR stem, --norm", lambda shape, n, o: resnet8(shape, n, o.norm)),
        ModelSpec("resnet18", "ResNet-18, CIFAR stem, --norm", lambda shape, n, o: resnet18(shape, n, o.norm)),
        ModelSpec(
            "cnn-cifar", "FedAvg-FT's CNN: 3 x (conv, conv, pool), 3-layer MLP", lambda shape, n, o: CNNCifar(shape, n)
        ),
        ModelSpec(
            "linear-rep",
            "y = <B w, x>, B (d, --rep-dim), w (--rep-dim,)",
            lambda shape, n, o: LinearRepresentation(math.prod(shape), o.rep_dim),
            task="regression",
            images=False,
        ),
    ]
}


def model_spec(name: str) -> ModelSpec:
    """A built-in model, or a 'package.module:function' reference to the user's: function(input_shape,
    n_classes) returns an nn.Module (its attribute task = "regression" makes it a regression model)."""
    if name in MODELS:
        return MODELS[name]
    if not is_reference(name):
        raise UserError(
            f"unknown model {name!r}; choose one of: {', '.join(MODELS)}, or name your own as package.module:function"
        )
    make = load_object(name, "--model")
    if not callable(make):
        raise UserError(f"--model {name} is not a function of (input_shape, n_classes)")
    return ModelSpec(
        name,
        "the user's model",
        lambda shape, n, o: _checked(
            call_plugin(f"--model {name} (building the model)", make, shape, n), name, shape, n
        ),
        task=getattr(make, "task", "classification"),
        images=False,
    )


def _checked(model, name: str, shape: tuple[int, ...], n_outputs: int) -> nn.Module:
    """The user's model as it enters: a Module of float32 parameters whose forward maps a batch of the
    dataset's inputs to one (batch, n_outputs) tensor; tried on two zero inputs, in eval mode (no batch
    statistics change)."""
    where = f"--model {name}"
    if not isinstance(model, nn.Module):
        raise UserError(f"{where} returned a {type(model).__name__}, not a torch.nn.Module")
    params = list(model.parameters())
    if not any(p.requires_grad for p in params):
        raise UserError(f"{where} has no parameters to train (none requires grad)")
    kinds = sorted({str(p.dtype) for p in params} - {"torch.float32"})
    if kinds:
        raise UserError(f"{where} has {', '.join(kinds)} parameters; p2pfl trains float32 (build it with .float())")
    if any(size < 1 for size in shape):
        raise UserError(f"{where}: the dataset's inputs have shape {tuple(shape)}; every dimension needs a size >= 1")
    training = model.training
    model.eval()
    before = [p.detach().clone() for p in params if not p.is_meta]  # a model sized on the meta device has no values
    out = call_plugin(f"{where} (a forward pass of 2 inputs of shape {tuple(shape)})", model, torch.zeros(2, *shape))
    model.train(training)
    if any(not torch.equal(a, p.detach()) for a, p in zip(before, [p for p in params if not p.is_meta])):
        raise UserError(f"{where}: its forward pass changed its own parameters; training changes them, not forward")
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, n_outputs):
        got = f"a {type(out).__name__}" if not isinstance(out, torch.Tensor) else f"shape {tuple(out.shape)}"
        raise UserError(
            f"{where}: a batch of 2 inputs of shape {tuple(shape)} gave {got}; p2pfl needs one tensor of "
            f"shape (2, {n_outputs}), a score per {'class' if n_outputs > 1 else 'output'}"
        )
    if not out.is_floating_point():
        raise UserError(f"{where} returns {str(out.dtype).replace('torch.', '')} scores; p2pfl needs float ones")
    if not out.requires_grad:
        raise UserError(f"{where} returns scores that do not depend on its parameters (detached?); none could train")
    return model


def build_model(name: str, input_shape: tuple[int, ...], n_outputs: int, options) -> nn.Module:
    """options carries hidden, norm and rep_dim (a RunConfig does)."""
    return model_spec(name).build(tuple(input_shape), n_outputs, options)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


__all__ = [
    "MLP",
    "MLPShape",
    "MODELS",
    "ModelSpec",
    "ParamLayout",
    "PeerStack",
    "build_model",
    "count_parameters",
    "initial_parameters",
    "model_spec",
    "reset_model",
]
