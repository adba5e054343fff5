"""What a peer's Jacobian message leaks: a gradient-inversion attack on Fashion-MNIST images.

    python -m analysis.privacy [--images 16] [--steps 300] [--seed 0] [--out runs/privacy]

The attacker is a neighbour in NTK-DFL: it receives peer i's message about i's samples, taken at the
attacker's own weights (so it knows them), and knows the shared projection seed. For every sample it
optimises a dummy image until the Jacobian the codec would compute from it matches the one received
on the entries the message carries (NTK-DFL appendix E, NTK-FL appendix B). Conditions: dense
Jacobians uncompressed, top-k sparsity, b-bit quantisation, and the random input projection; plus the
factored message (the default path for MLPs), which carries the first layer's inputs as they are.
Writes OUT/privacy.md and .csv (SSIM between true and recovered images, scikit-image's
structural_similarity on [0, 1] pixels) and OUT/privacy.png (true images, then one row per condition).
"""

from __future__ import annotations

import csv
import time
from pathlib import Path

import numpy as np
import torch

from analysis.toolkit import Parser, guarded, output_folder, writable

MAX_IMAGES = 256
# name -> (NTK-DFL settings, the codec path). The factored path sends what the MLP's layers take in.
CONDITIONS = {
    "factored message (default)": ({}, "factored"),
    "dense, uncompressed": ({}, "dense"),
    "top-k 50%": ({"ntk_topk": 0.5}, "dense"),
    "top-k 10%": ({"ntk_topk": 0.1}, "dense"),
    "top-k 1%": ({"ntk_topk": 0.01}, "dense"),
    "8-bit": ({"ntk_quant_bits": 8}, "dense"),
    "4-bit": ({"ntk_quant_bits": 4}, "dense"),
    "2-bit": ({"ntk_quant_bits": 2}, "dense"),
    "projection 400": ({"ntk_projection": 400}, "dense"),
    "projection 200": ({"ntk_projection": 200}, "dense"),
    "projection 100": ({"ntk_projection": 100}, "dense"),
}


def victim_context(settings: dict, path: str, seed: int):
    """A one-peer NTK-DFL run context with the condition's settings (data projected where asked)."""
    from p2pfl.runner.configure import make_config, resolve
    from p2pfl.runner.assemble import build

    values = {
        "algo": "ntk-dfl",
        "dataset": "fashion-mnist",
        "peers": 2,
        "kappa": 1,
        "samples_per_peer": 64,
        "seed": seed,
        "progress": False,
        "ntk_jacobian": path,
        "ntk_memory_gb": 16.0,
        **settings,
    }
    ctx, _ = build(resolve(make_config(values), 1), 0, 1, 0)
    return ctx


def pixels(x: torch.Tensor, mean: float, std: float) -> np.ndarray:
    """Normalised inputs (n, 784) -> images (n, 28, 28) in [0, 1]."""
    return (x.reshape(-1, 28, 28) * std + mean).clamp(0, 1).cpu().numpy()


def received(ctx, x_sent: torch.Tensor):
    """What the neighbour decodes from the message about x_sent: (Jacobian, mask of the entries the
    message carries), both (n, C, D) for dense paths; the factored message's first-layer inputs."""
    from p2pfl.algorithms.ntk_options import JacobianMessage, make_codec

    codec = make_codec(ctx, ctx.cfg.settings)
    w = ctx.flat[1]  # the attacker's weights: the Jacobian is taken at them
    jac, f = codec.compute(w, x_sent)
    message, _ = JacobianMessage.of(codec, jac, f, torch.zeros(len(x_sent), dtype=torch.long))
    decoded, _, _ = message.read(codec)
    if codec.path == "factored":
        return decoded, None, message
    J = decoded.J
    mask = J != 0 if codec.keep < 1 else torch.ones_like(J, dtype=torch.bool)
    return J, mask, message


def invert(
    ctx, J: torch.Tensor, mask: torch.Tensor, projection: torch.Tensor | None, steps: int, box: tuple[float, float]
) -> torch.Tensor:
    """Dummy images (n, 784) whose Jacobians match J (n, C, D) on mask: Adam on each image's relative
    squared error, projected onto the valid pixel range after every step, from a mid-grey start (an
    all-zero start has every ReLU off and no gradient). The dummy Jacobians are built from the MLP's
    factors: the dense path's numbers, differentiable in the inputs."""
    from p2pfl.models import MLPShape
    from p2pfl.ntk.jacobian import FactoredJacobian

    shape = MLPShape.of(ctx.stack.model, ctx.stack.layout)
    w = ctx.flat[1]
    keep = mask.float()
    scale = ((J * keep) ** 2).sum((1, 2)).clamp(min=1e-30)
    x = torch.full((len(J), 784), sum(box) / 2, requires_grad=True)
    opt = torch.optim.Adam([x], lr=0.1)
    for _ in range(steps):
        factors, _ = FactoredJacobian.compute(shape, w, x @ projection if projection is not None else x)
        loss = ((((factors.dense(shape, w) - J) * keep) ** 2).sum((1, 2)) / scale).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            x.clamp_(*box)
    return x.detach()


def study(images: int = 16, steps: int = 300, seed: int = 0, out: Path = Path("runs/privacy")) -> list[dict]:
    from skimage.metrics import structural_similarity

    from p2pfl.data.sources import NORMALISATION
    from p2pfl.ntk.compression import gaussian_projection

    (mean,), (std,) = NORMALISATION["fashion-mnist"]
    plain = victim_context({}, "dense", seed)
    rng = np.random.default_rng(seed)
    pick = torch.from_numpy(np.sort(rng.choice(len(plain.data.train_x), images, replace=False)))
    x_true = plain.data.train_x[pick].reshape(images, -1)
    truth = pixels(x_true, mean, std)
    box = ((0 - mean) / std, (1 - mean) / std)
    rows, recovered = [], {}
    for name, (settings, path) in CONDITIONS.items():
        start = time.perf_counter()
        ctx = victim_context(settings, path, seed)
        d_out = settings.get("ntk_projection", 0)
        P = gaussian_projection(784, d_out, seed) if d_out else None
        x_sent = x_true @ P if P is not None else x_true
        J, mask, message = received(ctx, x_sent)
        if mask is None:  # factored: the first layer's inputs travel as they are
            guess = J.acts[0] if P is None else J.acts[0] @ torch.linalg.pinv(P)
        else:
            guess = invert(ctx, J, mask, P, steps, box)
        images_back = pixels(guess, mean, std)
        ssim = np.array([structural_similarity(t, r, data_range=1.0) for t, r in zip(truth, images_back)])
        recovered[name] = images_back
        rows.append(
            {
                "condition": name,
                "bytes_per_image": round(message_bytes(message) / images),
                "ssim_mean": float(ssim.mean()),
                "ssim_std": float(ssim.std()),
                "ssim_min": float(ssim.min()),
                "ssim_max": float(ssim.max()),
                "seconds": round(time.perf_counter() - start, 1),
            }
        )
        print(f"{name}: SSIM {ssim.mean():.3f} (min {ssim.min():.3f}), {rows[-1]['seconds']} s", flush=True)
    write(rows, truth, recovered, out, images, steps)
    return rows


def message_bytes(message) -> int:
    return sum(t.numel() * t.element_size() for t in message.tensors())


def write(rows: list[dict], truth: np.ndarray, recovered: dict, out: Path, images: int, steps: int) -> None:
    from analysis.plots import plt

    out.mkdir(parents=True, exist_ok=True)
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        lines.append("| " + " | ".join(f"{v:.3f}" if k.startswith("ssim") else str(v) for k, v in r.items()) + " |")
    (out / "privacy.md").write_text(
        f"Gradient inversion of {images} Fashion-MNIST training images from NTK-DFL Jacobian messages "
        f"(Adam, {steps} steps; SSIM 1 = perfect recovery)\n\n" + "\n".join(lines) + "\n"
    )
    with (out / "privacy.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)
    shown = min(images, 8)
    fig, axes = plt.subplots(
        len(recovered) + 1, shown, figsize=(1.3 * shown + 2.2, 1.3 * (len(recovered) + 1)), squeeze=False
    )
    ssim = {r["condition"]: r["ssim_mean"] for r in rows}
    for row, (label, imgs) in enumerate([("true images", truth), *recovered.items()]):
        for col in range(shown):
            ax = axes[row, col]
            ax.imshow(imgs[col], cmap="gray", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
        text = label if row == 0 else f"{label}\nSSIM {ssim[label]:.2f}"
        axes[row, 0].set_ylabel(text, rotation=0, ha="right", va="center", fontsize=7)
    fig.suptitle("what a neighbour recovers from a peer's Jacobian message", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "privacy.png", dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    return guarded("analysis.privacy", lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    p = Parser(prog="python -m analysis.privacy", description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=16, help="images attacked (default 16)")
    p.add_argument("--steps", type=int, default=300, help="optimisation steps per condition (default 300)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("runs/privacy"))
    args = p.parse_args(argv)
    if not 1 <= args.images <= MAX_IMAGES or args.steps < 1:
        p.error(
            f"--images must be in [1, {MAX_IMAGES}] (each holds 3.2 MB of dense Jacobians a step) and --steps "
            "at least 1"
        )
    if not 0 <= args.seed < 2**63:
        p.error(f"--seed must be in [0, 2^63), got {args.seed}")
    writable(output_folder(args.out))
    study(args.images, args.steps, args.seed, args.out)
    print((args.out / "privacy.md").read_text(), end="")
    print(f"image grid: {args.out / 'privacy.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
