"""One speed figure of the device check on one device: seconds per round of a real round (p2pfl.runner.simulation's
build and the algorithm's round, the GPU synchronized before each clock read), and the peak GPU memory;
printed as one JSON line for bench/gpu_check.sh to set beside the same figure on the CPU.

Figures (the targets of the GPU work):
- dfedavg: DFedAvg, 300 peers, the paper preset's settings (MLP, 20 local epochs, batch 25);
- dfedavg-cnn: the same with cnn-fmnist (dropout; unequal shards);
- ntk-dfl: NTK-DFL, 300 peers, p2pfl/presets/ntk-dfl-fmnist300.toml (accurate ODE, t in 100..800), with
  the t each peer chose in round 1, as the round reports it (the CPU and the GPU should mostly choose the
  same: a t is discrete, and rounding can tip a near tie);
- tct-stage1: TCT's stage 1 at paper scale (bench/bench_cnn.py --tct-stage1: 10 clients of 6,000 images,
  SimpleCNN, 5 epochs, batch 64).

Usage: python bench/gpu_figures.py FIGURE --device cuda [--rounds 2] [--data-dir D] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import p2pfl  # noqa: E402,F401  (first: numpy's BLAS on one thread)
import torch  # noqa: E402

from p2pfl.runner.configure import load_toml, make_config, resolve  # noqa: E402
from p2pfl.runner.loop import synchronize  # noqa: E402
from p2pfl.runner.assemble import build  # noqa: E402
from p2pfl.testing import chosen_taus  # noqa: E402

PAPER_300 = {
    "peers": 300,
    "kappa": 5,
    "alpha": 0.1,
    "dirichlet_style": "per-peer",
    "samples_per_peer": 200,
    "dataset": "fashion-mnist",
    "progress": False,
}
FIGURES = {
    "dfedavg": {**load_toml(str(ROOT / "p2pfl/presets/dfedavg-fmnist300.toml")), "progress": False},
    # lr 0.01: the preset's 0.1 is the MLP's, and cnn-fmnist diverges with it in some peers (speed is the same)
    "dfedavg-cnn": {
        **load_toml(str(ROOT / "p2pfl/presets/dfedavg-fmnist300.toml")),
        "model": "cnn-fmnist",
        "lr": 0.01,
        "progress": False,
    },
    "ntk-dfl": {**load_toml(str(ROOT / "p2pfl/presets/ntk-dfl-fmnist300.toml")), "progress": False},
    "tct-stage1": {
        "algo": "fedavg",
        "model": "simple-cnn",
        "dataset": "fashion-mnist",
        "peers": 10,
        "clients_per_round": 10,
        "partition": "dirichlet",
        "dirichlet_style": "per-class",
        "alpha": 0.1,
        "samples_per_peer": 6000,
        "local_epochs": 5,
        "batch_size": 64,
        "lr": 0.01,
        "progress": False,
    },
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("figure", choices=sorted(FIGURES))
    p.add_argument("--device", default="cuda")
    p.add_argument("--rounds", type=int, default=2, help="rounds timed; the fastest is reported (the first warms up)")
    p.add_argument("--data-dir", help="the dataset's folder (default: the usual lookup)")
    p.add_argument("--dataset", help="another dataset of the same shape (a stand-in where Fashion-MNIST is absent)")
    p.add_argument("--peers", type=int, help="fewer peers (a quick try of the script)")
    p.add_argument("--epochs", type=int, help="fewer local epochs (a CPU baseline that would take minutes)")
    p.add_argument("--samples", type=int, help="fewer samples per peer (a quick try of the script)")
    p.add_argument("--json", help="also write the figure's JSON to this file (the device check reads it)")
    a = p.parse_args()
    values = {k.replace("-", "_"): v for k, v in FIGURES[a.figure].items()}
    values.update(
        device=a.device,
        **({"data_dir": a.data_dir} if a.data_dir else {}),
        **({"dataset": a.dataset} if a.dataset else {}),
        **({"peers": a.peers} if a.peers else {}),
        **({"local_epochs": a.epochs} if a.epochs else {}),
        **({"samples_per_peer": a.samples} if a.samples else {}),
    )
    values.pop("rounds", None)
    if "clients_per_round" in values:  # fewer --peers than the figure samples: all of them
        values["clients_per_round"] = min(values["clients_per_round"], values["peers"])
    cfg = resolve(make_config(values), 1)
    ctx, algorithm = build(cfg, 0, 1, 0)
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)
    seconds, taus = [], None
    for k in range(a.rounds):
        synchronize(ctx.device)
        start = time.perf_counter()
        result = algorithm.round(k)
        synchronize(ctx.device)
        seconds.append(time.perf_counter() - start)
        if k == 0:
            taus = chosen_taus(result) or None
    peak = torch.cuda.max_memory_reserved(ctx.device) / 2**30 if ctx.device.type == "cuda" else None
    line = json.dumps(
        {
            "figure": a.figure,
            "device": str(ctx.device),
            "seconds": seconds,
            "best": min(seconds),
            "peak_gpu_gb": peak,
            "epochs": cfg.local_epochs,
            "taus": taus,
            "finite": bool(torch.isfinite(ctx.flat).all()),
        }
    )
    print(line)
    if a.json:
        Path(a.json).write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
