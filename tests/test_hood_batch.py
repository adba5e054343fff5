"""A chunk of neighbourhoods as one padded batch (p2pfl.ntk.hood_batch, a GPU's NTK-DFL step) against the
per-problem step on the same Jacobians: kernels, J^T R, candidate losses and the chosen t, on an MLP of
two hidden layers (the backprop signals' recursion) and neighbourhoods of unequal sizes (padding)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from p2pfl.models.mlp import MLPShape
from p2pfl.ntk.hood_batch import HoodBatch, batched_steps
from p2pfl.ntk.jacobian import FactoredJacobian
from p2pfl import testing
from p2pfl.ntk.step import NTKProblem, NTKSettings, ntk_steps
from tests.conftest import ROOT

DIMS = [(9, 12), (7, 9), (4, 7)]  # (out, in): 12 inputs, two hidden layers, 4 classes


def mlp_shape() -> MLPShape:
    weights, biases, at = [], [], 0
    for out, inputs in DIMS:
        weights.append(slice(at, at + out * inputs))
        biases.append(slice(at + out * inputs, at + out * inputs + out))
        at += out * inputs + out
    return MLPShape(weights, biases, DIMS, "relu")


def hoods(sizes_per_hood: list[list[int]], seed: int = 0):
    """Per neighbourhood: its weights and its members' (Jacobian, outputs, labels) taken at them."""
    gen = torch.Generator().manual_seed(seed)
    shape, out = mlp_shape(), []
    D = shape.weights[-1].stop + DIMS[-1][0]
    for sizes in sizes_per_hood:
        w = 0.5 * torch.randn(D, generator=gen)
        members = []
        for n in sizes:
            x = torch.randn(n, 12, generator=gen)
            jac, f = FactoredJacobian.compute(shape, w, x)
            members.append((jac, f, torch.randint(0, 4, (n,), generator=gen)))
        out.append((w, members))
    return shape, out


def batch_of(shape, problems, own_only=False) -> HoodBatch:
    wires = [[(jac.to_wire(), f, y) for jac, f, y in members] for _, members in problems]
    w = torch.stack([w for w, _ in problems])
    return HoodBatch.gather(wires, [0] * len(problems), w, len(DIMS), own_only)


def test_the_batched_kernels_and_backprop_are_each_neighbourhoods_own():
    shape, problems = hoods([[5, 3, 4], [2], [6, 6]])
    batch = batch_of(shape, problems)
    H = batch.kernels(shape)
    R = torch.randn(len(problems), 3, H.shape[1], 4)
    R.mul_(batch.valid[:, None, :, None])
    JtR = batch.transpose_apply(shape, R)
    for b, (w, members) in enumerate(problems):
        jac = FactoredJacobian.cat([m[0] for m in members])
        n = jac.n
        assert torch.allclose(H[b, :n, :n], jac.kernel(shape, w), rtol=1e-5, atol=1e-5)
        assert not H[b, n:].any() and not H[b, :, n:].any()  # padding: no kernel entries
        assert torch.allclose(JtR[b], jac.transpose_apply(shape, w, R[b, :, :n]), rtol=1e-5, atol=1e-5)


def network_loss(shape, members, own_only):
    x = torch.cat([m[0].acts[0] for m in (members[:1] if own_only else members)])
    y = torch.cat([m[2] for m in (members[:1] if own_only else members)])

    def losses(candidates):
        out = []
        for c in candidates:
            h = x
            for layer in range(len(DIMS)):
                h = h @ shape.weight(c, layer).T + c[shape.biases[layer]]
                h = torch.relu(h) if layer < len(DIMS) - 1 else h
            out.append(F.cross_entropy(h, y))
        return torch.stack(out)

    return losses


def test_a_chunks_batched_steps_choose_each_problems_t_and_weights():
    shape, problems = hoods([[5, 3, 4], [2, 7], [6, 6, 1]], seed=3)
    for selection in ("network", "own", "linearized"):
        settings = NTKSettings(taus=(2, 5, 9), selection=selection)
        own_only = selection == "own"
        alone = ntk_steps(
            [
                NTKProblem(
                    FactoredJacobian.cat([m[0] for m in members]),
                    w,
                    torch.cat([m[1] for m in members]),
                    torch.cat([m[2] for m in members]),
                    network_loss(shape, members, own_only),
                )
                for w, members in problems
            ],
            shape,
            4,
            0.3,
            settings,
        )
        together = batched_steps(batch_of(shape, problems, own_only), shape, 0.3, settings)
        assert together.taus == [r.tau for r in alone], selection
        for b, (r, (w, _)) in enumerate(zip(alone, problems)):
            # the CPU's compiled loop against the batched one (the stiffest kernel's steps): ODE solutions apart
            # by their tolerance (3.6e-5 here), so the updates w - w0 within 2e-4 of each other
            off = float((together.weights[b] - r.weights).norm() / (r.weights - w).norm())
            assert off < 2e-4, (selection, b, off)
            assert torch.allclose(together.losses[b], r.losses, rtol=1e-3), (selection, b)


@pytest.mark.mpi
def test_the_padded_batch_on_three_ranks_follows_one_process(tmp_path):
    """NTK-DFL's GPU path (tests/gpu_path_script.py) on mpirun -n 3 against one process. Each rank pads and
    steps its own chunk (its largest neighbourhood, its stiffest kernel's plan), so the rows agree within
    float tolerance, as a GPU run's do across layouts, not to the bit."""
    args = [
        "tests/gpu_path_script.py",
        *["--algo", "ntk-dfl", "--dataset", "synthetic", "--peers", "9", "--kappa", "2", "--rounds", "2"],
        *["--samples-per-peer", "40", "--alpha", "0.3", "--ntk-taus", "20,50", "--seed", "4", "--no-progress"],
    ]
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    rows = {}
    for name, ranks in (("one", 0), ("three", 3)):
        command = [sys.executable, *args, "--out", str(tmp_path / name)]
        if ranks:
            command = testing.mpirun_command(ranks, *command)
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        rows[name] = testing.results(tmp_path / name)["metrics"]
    assert len(rows["one"]) == len(rows["three"]) == 2
    for one, three in zip(rows["one"], rows["three"]):
        assert one["ntk_t_hist"] == three["ntk_t_hist"], (one["ntk_t_hist"], three["ntk_t_hist"])
        assert abs(one["test_acc"] - three["test_acc"]) <= 0.005, (one["test_acc"], three["test_acc"])
        assert abs(one["train_loss"] - three["train_loss"]) <= 1e-3 * abs(one["train_loss"])
