"""Final model averaging with client selection (NTK-DFL section 3.3 and fig. 5).

After training, the test set is split 50:50 into validation and test. Peers are ranked by their
model's validation accuracy and averaged in an order (high-to-low: the paper's selection; random;
low-to-high). For each number n of peers averaged, the averaged model's validation and test accuracy
are recorded, so the curve of fig. 5 can be drawn; the selected model averages the first n of the
high-to-low order with n picked by validation accuracy.
"""

from __future__ import annotations

import torch

from p2pfl.errors import UserError
from p2pfl.seeding import torch_generator
from p2pfl.local.forward import evaluate

ORDERS = ("high-to-low", "random", "low-to-high")


def grid(m: int, points: int = 60) -> list[int]:
    step = max(1, m // points)
    return sorted(set(list(range(1, min(m, 20) + 1)) + list(range(step, m + 1, step)) + [m]))


def check_test_halves(test_samples: int | None) -> None:
    """Final averaging splits the test samples into validation and test halves: it needs at least 2."""
    if test_samples is not None and test_samples < 2:
        raise UserError(
            f"--test-samples {test_samples}: NTK-DFL's final averaging splits the test samples "
            "into validation and test halves and needs at least 2"
        )


def final_averaging(
    stack, weights: torch.Tensor, test: tuple[torch.Tensor, torch.Tensor], counts: list[int] | None, seed: int
) -> dict:
    """The curves from every peer's weights (P, D) in peer order, on the test samples (x, y); counts: each
    peer's weight in an average (its samples: --aggregate sample-weighted), None: uniform."""
    x, y = test
    order = torch.randperm(len(y), generator=torch_generator(seed, "validation-split"))
    half = len(y) // 2
    val, test = order[:half].to(x.device), order[half:].to(x.device)
    val_acc = evaluate(stack, weights, x[val], y[val])["acc"]
    counts = (
        torch.ones(len(weights), dtype=weights.dtype, device=weights.device)
        if counts is None
        else torch.tensor(counts, dtype=weights.dtype, device=weights.device)
    )
    ns = grid(len(weights))
    result: dict = {
        "n": ns,
        "client_val_acc": val_acc.tolist(),
        "orders": {},
        "val_samples": len(val),
        "test_samples": len(test),
    }
    for name in ORDERS:
        if name == "random":
            perm = torch.randperm(len(weights), generator=torch_generator(seed, "final-order"))
        else:
            perm = torch.argsort(val_acc.cpu(), descending=name == "high-to-low", stable=True)
        perm = perm.to(weights.device)
        cum_w = torch.cumsum(weights[perm] * counts[perm, None], 0)
        cum_n = torch.cumsum(counts[perm], 0)
        index = torch.tensor([n - 1 for n in ns], device=weights.device)
        averaged = cum_w[index] / cum_n[index, None]
        v_acc = evaluate(stack, averaged, x[val], y[val])["acc"]
        t_acc = evaluate(stack, averaged, x[test], y[test])["acc"]
        result["orders"][name] = {"val_acc": v_acc.tolist(), "test_acc": t_acc.tolist()}
    best = result["orders"]["high-to-low"]
    pick = max(range(len(ns)), key=lambda i: (best["val_acc"][i], -i))
    result["selected"] = {
        "order": "high-to-low",
        "peers": ns[pick],
        "val_acc": best["val_acc"][pick],
        "test_acc": best["test_acc"][pick],
    }
    result["all_peers"] = {"val_acc": best["val_acc"][-1], "test_acc": best["test_acc"][-1]}
    return result
