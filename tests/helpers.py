"""Build a run's context in-process, for tests that poke at one round; the device the cuda tests check."""

import os

import pytest
import torch

from p2pfl.runner.configure import make_config, resolve
from p2pfl.runner.assemble import build


def make_context(**settings):
    values = {"dataset": "synthetic", "peers": 8, "kappa": 3, "progress": False, **settings}
    cfg = resolve(make_config(values), 1)
    return build(cfg, 0, 1, 0)


def metric_lines(run_dir):
    import json

    from p2pfl.testing import MACHINE_FACTS

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in MACHINE_FACTS} for row in rows]


# The device the `cuda` tests set beside the CPU: the GPU, or the CPU itself in the device check's rehearsal
# here (P2PFL_CHECK_DEVICE=cpu: every step of bench/gpu_check.sh runs, comparing the CPU with itself).
CHECK_DEVICE = os.environ.get("P2PFL_CHECK_DEVICE", "cuda")
needs_check_device = pytest.mark.skipif(
    CHECK_DEVICE.startswith("cuda") and not torch.cuda.is_available(), reason="no CUDA device here"
)
