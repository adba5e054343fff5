"""Models on samples without training: each model's test metrics (evaluate, in passes sized to the
device) and the loss of NTK evolution's candidate models on the same samples (candidate_losses)."""

from __future__ import annotations

import torch

from p2pfl.models import PeerStack


@torch.no_grad()
def candidate_losses(
    stack: PeerStack, candidates: torch.Tensor, x: torch.Tensor, y: torch.Tensor, loss: str = "task", pixels=None
) -> torch.Tensor:
    """The mean loss of each row of candidates (T, D) on the same samples: (T,). loss 'task' is the
    task's own loss; 'mse' is the halved squared error against one-hot labels, summed over classes
    (NTK evolution with --ntk-loss mse selects by it, as the reference code does). pixels: x as
    p2pfl.ntk.pixels.PixelInputs, where it is pixels (an MLP's first layer then in integer arithmetic;
    x may then be None)."""
    if stack.mlp is not None:
        outputs = _mlp_shared_outputs(stack.mlp, candidates, x, pixels)
    else:
        outputs = stack.forward(candidates, x, shared_input=True)
    if loss == "mse":
        target = torch.nn.functional.one_hot(y, outputs.shape[-1]).to(outputs.dtype)
        return 0.5 * ((outputs - target) ** 2).sum(-1).mean(-1)
    return stack.task.losses(outputs, y.expand(len(candidates), *y.shape)).mean(1)


def _mlp_shared_outputs(shape, flat: torch.Tensor, x: torch.Tensor, pixels=None) -> torch.Tensor:
    """The outputs (L, B, C) of L MLPs flat (L, D) on the same samples x, by batched products: the first
    layer one matrix product whose rows are every model's units. For NTK selection (8 candidates on a
    neighbourhood's 1,200 samples) it takes about half the time of vmap of functional_call."""
    L = len(flat)
    for i, (out, inputs) in enumerate(shape.dims):
        W, b = flat[:, shape.weights[i]].reshape(L, out, inputs), flat[:, shape.biases[i]].reshape(L, out, 1)
        if i == 0 and pixels is not None:
            z = pixels.right(W.reshape(L * out, inputs)).add_(b.reshape(L * out, 1)).view(L, out, -1)
        elif i == 0:
            z = torch.addmm(b.reshape(L * out, 1), W.reshape(L * out, inputs), x.reshape(len(x), -1).T).view(L, out, -1)
        else:
            z = torch.baddbmm(b, W, z.clamp_(min=0))  # the previous layer's activations, in place
    return z.transpose(1, 2)


EVAL_SAMPLES = 5000  # test samples per forward pass at most
# on the CPU smaller passes stay in cache: 300 MLP peers x 7,000 samples took 1.8 s in passes of 10 x 2,000
# and 2.4 s in passes of 25 x 5,000 (2-core CPU, 2026-11-27)
EVAL_PEERS_CPU, EVAL_SAMPLES_CPU = 10, 2000


def evaluation_chunks(stack: PeerStack, peers: int, samples: int, sample_shape: tuple[int, ...]) -> tuple[int, int]:
    """(peers, samples) per forward pass of evaluate: sized, as training's batches are, from the per-sample
    activation estimate and the rank's batch budget, so that evaluation fits wherever training does
    (resnet18 at 32x32 holds about 22 MB a sample: 300 peers x 5,000 samples would be terabytes)."""
    per_sample = stack.activation_bytes(sample_shape)
    budget = stack.batch_budget()
    cpu = stack.device.type == "cpu"
    sample_chunk = max(1, min(samples, EVAL_SAMPLES_CPU if cpu else EVAL_SAMPLES, budget // per_sample))
    return max(1, min(peers, EVAL_PEERS_CPU if cpu else peers, budget // (per_sample * sample_chunk))), sample_chunk


@torch.no_grad()
def evaluate(
    stack: PeerStack, flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor, by_sample: bool = False
) -> dict[str, torch.Tensor] | tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The task's metrics (accuracy and loss for classification) of each row of flat (L, D) on (x, y),
    averaged over the samples: {metric: (L,)}. by_sample: also each metric of each row, sample by sample
    {metric: (L, n)}, from which the precision of a mean over a subset of samples follows."""
    task = stack.task
    sums = {m: torch.zeros(len(flat), device=flat.device) for m in task.metrics}
    per_sample = {m: torch.zeros(len(flat), len(x), device=flat.device) if by_sample else None for m in task.metrics}
    peer_chunk, sample_chunk = evaluation_chunks(stack, len(flat), len(x), tuple(x.shape[1:]))
    for p in range(0, len(flat), peer_chunk):
        rows = flat[p : p + peer_chunk]
        for s in range(0, len(x), sample_chunk):
            xb, yb = x[s : s + sample_chunk], y[s : s + sample_chunk]
            outputs = stack.forward(rows, xb, shared_input=True)
            for m, values in task.per_sample(outputs, yb.expand(len(rows), *yb.shape)).items():
                sums[m][p : p + peer_chunk] += values.sum(1)
                if by_sample:
                    per_sample[m][p : p + peer_chunk, s : s + sample_chunk] = values
    means = {m: v / len(x) for m, v in sums.items()}
    return (means, per_sample) if by_sample else means


@torch.no_grad()
def evaluate_own(
    stack: PeerStack, flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Each row of flat (L, D) on its own samples, x[index[i]] for row i (index (L, n) on x's device):
    each metric of each row, sample by sample {metric: (L, n)}, in chunks of rows and samples sized as
    evaluate's."""
    out = {m: torch.zeros(len(flat), index.shape[1], device=flat.device) for m in stack.task.metrics}
    peer_chunk, sample_chunk = evaluation_chunks(stack, len(flat), index.shape[1], tuple(x.shape[1:]))
    # one buffer for every chunk's inputs: a fresh tensor a chunk costs its page faults (10x the gather on a CPU)
    xs_buffer = torch.empty(
        min(len(flat), peer_chunk) * min(index.shape[1], sample_chunk), *x.shape[1:], dtype=x.dtype, device=x.device
    )
    for p in range(0, len(flat), peer_chunk):
        for s in range(0, index.shape[1], sample_chunk):
            at = index[p : p + peer_chunk, s : s + sample_chunk]
            flat_at = at.reshape(-1)
            xs = torch.index_select(x, 0, flat_at, out=xs_buffer[: len(flat_at)]).view(*at.shape, *x.shape[1:])
            outputs = stack.forward(flat[p : p + peer_chunk], xs, shared_input=False)
            for m, values in stack.task.per_sample(outputs, y.index_select(0, flat_at).view(at.shape)).items():
                out[m][p : p + peer_chunk, s : s + sample_chunk] = values
    return out
