"""What a run learns: the loss that training minimises, the metrics of each evaluation, and the
headline metric of plots and progress bar. Training, evaluation, metrics.jsonl and the plots ask the
task; nothing else assumes that labels are classes."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Task:
    name: str
    metrics: tuple[str, ...]  # per-sample metrics averaged by evaluation, in metrics.jsonl order
    headline: str  # the metric of plots and progress bar
    higher_is_better: bool

    def losses(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Per-sample training loss: outputs (..., out), targets (...) -> (...)."""
        raise NotImplementedError

    def per_sample(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each metric of one sample, same shape as targets."""
        raise NotImplementedError

    def format(self, value: float) -> str:
        return f"{value:.4g}"


class Classification(Task):
    """Any model with one output per class; cross-entropy; accuracy."""

    def __init__(self):
        super().__init__("classification", ("acc", "loss"), "acc", True)

    def losses(self, outputs, targets):
        return F.cross_entropy(outputs.reshape(-1, outputs.shape[-1]), targets.reshape(-1), reduction="none").view(
            targets.shape
        )

    def per_sample(self, outputs, targets):
        return {"acc": (outputs.argmax(-1) == targets).to(outputs.dtype), "loss": self.losses(outputs, targets)}

    def format(self, value):
        return f"{100 * value:.1f}%"


class Regression(Task):
    """A scalar output per sample; the squared loss (y - f)^2 / 2, reported as 'loss'."""

    def __init__(self):
        super().__init__("regression", ("loss",), "loss", False)

    def losses(self, outputs, targets):
        return 0.5 * (outputs.reshape(targets.shape) - targets) ** 2

    def per_sample(self, outputs, targets):
        return {"loss": self.losses(outputs, targets)}


TASKS = {"classification": Classification(), "regression": Regression()}
