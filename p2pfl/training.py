"""Local SGD for a rank's peers, all peers in one batch.

Peers hold different numbers of samples, so a step carries a (peers, batch) mask: padded rows add
nothing to the loss and a peer without a batch at this step is left untouched (weights and momentum),
which makes the batched run equal, peer by peer, to training each peer alone.
"""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from p2pfl import stopping
from p2pfl.models.stack import PeerStack
from p2pfl.seeding import keyed_orders, peer_keys
from p2pfl.tasks import Task


@dataclass
class SGDSettings:
    """Local SGD's settings; the round's learning rate travels beside them (it decays with the round)."""

    batch_size: int
    epochs: int = 1
    momentum: float = 0.0
    weight_decay: float = 0.0
    steps: int | None = None  # a fixed number of local steps instead of epochs
    prox_mu: float = 0.0  # FedProx: gradient of (mu/2)||w - anchor||^2 added to each step
    clip: float = 0.0  # the largest 2-norm of a peer's loss gradient (torch's clip_grad_norm_); 0: off


@dataclass
class Contrast:
    """MOON's model-contrastive term: mu times the cross-entropy of telling, with cosine similarities
    over a temperature, the global model's representation of a sample (the positive) from the
    client's previous model's (the negative), each row (L, D) the weights of those two models."""

    global_weights: torch.Tensor
    previous: torch.Tensor
    mu: float
    temperature: float

    def rows(self, index) -> "Contrast":
        return Contrast(self.global_weights[index], self.previous[index], self.mu, self.temperature)

    def losses(self, stack: PeerStack, features: torch.Tensor, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(L,): mu times the masked mean contrastive loss of the local features (L, B, E)."""
        with torch.no_grad():
            positive = stack.forward(self.global_weights, x, features=True)[1]
            negative = stack.forward(self.previous, x, features=True)[1]
        logits = torch.stack([F.cosine_similarity(features, positive, dim=-1),
                              F.cosine_similarity(features, negative, dim=-1)], -1) / self.temperature
        per_sample = torch.logsumexp(logits, -1) - logits[..., 0]
        return self.mu * (per_sample * mask).sum(1) / mask.sum(1).clamp(min=1)


@dataclass
class StepTerms:
    """What an algorithm adds to each peer's local steps, per row: FedProx's anchor, SCAFFOLD's
    control-variate correction (c - c_i), MOON's contrastive loss, DisPFL's sparsity mask (the
    weights are multiplied by it after every step, so only kept coordinates train)."""

    anchor: torch.Tensor | None = None
    offset: torch.Tensor | None = None
    contrast: Contrast | None = None
    mask: torch.Tensor | None = None

    def rows(self, index) -> "StepTerms":
        pick = lambda t: None if t is None else t[index]  # noqa: E731
        return StepTerms(pick(self.anchor), pick(self.offset), self.contrast.rows(index) if self.contrast else None,
                         pick(self.mask))

    def add_to(self, grad: torch.Tensor, flat: torch.Tensor, opt: SGDSettings) -> None:
        width = grad.shape[-1]  # the trainable part
        if self.anchor is not None and opt.prox_mu:
            grad.add_(flat - self.anchor[..., :width], alpha=opt.prox_mu)
        if self.offset is not None:
            grad.add_(self.offset[..., :width])


def masked_loss(task: Task, outputs: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The task's mean loss per peer over its unmasked rows: (L, B, out), (L, B), (L, B) -> (L,)."""
    return (task.losses(outputs, y) * mask).sum(1) / mask.sum(1).clamp(min=1)


def gradients(stack: PeerStack, flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor,
              noise: dict[str, torch.Tensor] | None = None,
              contrast: Contrast | None = None, sizes: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-peer gradients of the masked mean loss with respect to the trainable part of each row:
    (L, trainable), and the losses (L,). Batch norm's running statistics in flat are updated in place.

    With batch norm, padded rows would enter the batch statistics, so peers are forwarded in groups of
    equal batch length, each with its real rows only; rows without a batch are not forwarded at all.
    sizes: each row's batch length, on the CPU, where the caller knows it (reading it from a GPU's mask
    would wait for the device)."""
    if _hand_written(stack, noise, contrast):
        with one_torch_thread():
            return _mlp_gradients(stack, flat, x, y, mask)
    if not stack.couples_samples:
        return _gradients(stack, flat, x, y, mask, noise, contrast)
    sizes = (mask.sum(1) if sizes is None else sizes).long().cpu()
    lengths = set(sizes.tolist())
    if len(lengths) == 1 and 0 not in lengths:  # every row a batch of one length: no groups to gather
        b = lengths.pop()
        part_noise = {k: v[:, : v.shape[1] // x.shape[1] * b] for k, v in (noise or {}).items()}
        return _gradients(stack, flat, x[:, :b], y[:, :b], mask[:, :b], part_noise, contrast)
    grad = torch.zeros(len(flat), stack.layout.trainable, device=flat.device, dtype=flat.dtype)
    losses = torch.zeros(len(flat), device=flat.device, dtype=flat.dtype)
    for b in sorted(set(sizes.tolist()) - {0}):
        rows = to_device((sizes == b).nonzero()[:, 0], flat.device)
        sub = flat[rows]
        part_noise = {k: v[rows, : v.shape[1] // x.shape[1] * b] for k, v in (noise or {}).items()}
        grad[rows], losses[rows] = _gradients(stack, sub, x[rows, :b], y[rows, :b], mask[rows, :b], part_noise,
                                              contrast.rows(rows) if contrast else None)
        flat[rows, stack.layout.trainable:] = sub[:, stack.layout.trainable:]  # the updated running statistics
    return grad, losses


def _hand_written(stack: PeerStack, noise=None, contrast=None) -> bool:
    """Whether a step takes _mlp_gradients: a batched MLP on a classification task, no extra loss term."""
    return stack.mlp is not None and stack.task.name == "classification" and noise is None and contrast is None


def _mlp_gradients(stack, flat, x, y, mask, sgd_lr: float | None = None):
    """_gradients for a batch of MLPs on a classification task, by hand: batched matrix products over
    the peers for the forward pass and backpropagation, instead of vmap of functional_call and autograd
    (several times faster on CPU, where a step of the 784-100-10 MLP is a few small products).

    With sgd_lr, the step itself is taken too (plain SGD: w -= lr * gradient), inside the products that
    make the gradients, and no gradient is returned: this saves writing and re-reading them."""
    shape = stack.mlp
    L, n_layers = len(flat), len(shape.dims)
    acts, gates, a = [], [], x.reshape(L, x.shape[1], -1)
    weights = [flat[:, shape.weights[i]].view(L, *shape.dims[i]) for i in range(n_layers)]
    for i in range(n_layers):
        acts.append(a)
        z = torch.baddbmm(flat[:, None, shape.biases[i]], a, weights[i].transpose(1, 2))
        if i < n_layers - 1:
            gates.append(z > 0)
            a = z.clamp(min=0)
    log_p = torch.log_softmax(z, -1)
    count = mask.sum(1).clamp(min=1)
    losses = -(log_p.gather(-1, y[..., None])[..., 0] * mask).sum(1) / count
    delta = log_p.exp_()
    delta.scatter_add_(-1, y[..., None], torch.full_like(delta[..., :1], -1.0))
    delta.mul_((mask / count[:, None])[..., None])  # d(mean loss)/dz for each peer
    out = None if sgd_lr else torch.empty(L, shape.dense_size(), dtype=flat.dtype, device=flat.device)  # no buffers
    for i in range(n_layers - 1, -1, -1):
        below = torch.bmm(delta, weights[i]).mul_(gates[i - 1]) if i else None  # with the weights before the step
        if sgd_lr:
            weights[i].baddbmm_(delta.transpose(1, 2), acts[i], alpha=-sgd_lr)
            flat[:, shape.biases[i]] -= sgd_lr * delta.sum(1)
        else:
            torch.bmm(delta.transpose(1, 2), acts[i], out=out[:, shape.weights[i]].view(L, *shape.dims[i]))
            out[:, shape.biases[i]] = delta.sum(1)
        delta = below
    return out, losses


def _gradients(stack, flat, x, y, mask, noise, contrast=None):
    """Each parameter is its own leaf (a view of flat): differentiating through slices of one flat leaf
    would make autograd build a zero-filled (L, D) tensor per parameter. Batch norm updates its running
    statistics in place, in copies that are written back to flat."""
    views = stack.layout.views(flat)
    names = list(views)[: stack.layout.n_params]
    leaves = {name: views[name].detach().requires_grad_(True) for name in names}
    buffers = {name: views[name].detach().clone() for name in list(views)[stack.layout.n_params:]}
    outputs = stack.forward_views({**leaves, **buffers}, x, train=True, noise=noise, features=contrast is not None)
    if contrast is not None:
        outputs, features = outputs
    losses = masked_loss(stack.task, outputs, y, mask)
    if contrast is not None:
        losses = losses + contrast.losses(stack, features, x, mask)
    grads = torch.autograd.grad(losses.sum(), list(leaves.values()))
    for name, value in buffers.items():  # vmap updates a contiguous copy in place, not a strided view
        views[name].copy_(value)
    out = torch.empty(len(flat), stack.layout.trainable, dtype=flat.dtype, device=flat.device)
    for slot, g in zip(stack.layout.slots, grads):  # one copy each (grads may be strided)
        out[:, slot.offset:slot.offset + slot.numel].view(g.shape).copy_(g)
    return out, losses.detach()


class MinibatchPlan:
    """A block's minibatches for one call of local training (a round), drawn where the weights live.

    Each peer's epoch order is a keyed permutation (p2pfl.seeding.keyed_orders) of its shard, keyed by
    (seed, 'shuffle', round, peer) and the epoch: the same on every layout and device, and made on the
    device in a few kernels for all the block's peers (per-peer generators on the CPU took 11.6 ms an
    epoch at 300 peers, more than the GPU's steps). Which peers step at which step follows from the
    shard sizes and step budgets alone, so that part is known on the CPU without asking the device."""

    def __init__(self, shards: list[torch.Tensor], peers: list[int], batch: int, seed: int, round_index: int,
                 budget: torch.Tensor, device: torch.device):
        self.batch, self.budget, self.device = batch, budget, device
        self.lengths = torch.tensor([len(s) for s in shards])
        self.width = max(1, int(self.lengths.max()))
        self.steps = math.ceil(self.width / batch)
        self.shards = padded_shards(shards, self.width, device)
        self.keys = peer_keys(seed, "shuffle", round_index, peers, device)
        self.on_device_lengths = to_device(self.lengths, device)
        self.taken = torch.zeros_like(budget)

    def unfinished(self) -> bool:
        return bool((self.taken < self.budget).any())

    def epoch(self, epoch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(sizes, index, mask, active) of the epoch's steps: sizes (steps, L) each row's batch length at
        each step (0 where it does not step; on the CPU), indices (steps, L, B) into the training set and
        the mask (steps, L, B) and active (steps, L) on the device. A row steps while it has a batch in
        this epoch and steps left in its budget."""
        s = torch.arange(self.steps)[:, None]
        sizes = (self.lengths[None] - s * self.batch).clamp(0, self.batch)
        sizes = sizes * ((sizes > 0) & (self.taken[None] + s < self.budget[None]))
        self.taken += (sizes > 0).sum(0)
        order = keyed_orders(self.keys, self.on_device_lengths, self.width, epoch)
        index = torch.nn.functional.pad(self.shards.gather(1, order), (0, self.steps * self.batch - self.width))
        index = index.view(len(self.keys), self.steps, self.batch).transpose(0, 1)
        stepping = to_device(sizes.to(torch.int32), self.device)
        mask = (torch.arange(self.batch, device=self.device) < stepping[..., None]).float()
        return sizes, index, mask, stepping > 0


def padded_shards(shards: list[torch.Tensor], width: int, device: torch.device | str) -> torch.Tensor:
    """The peers' sample indices as one (L, width) tensor on device, each row padded with 0."""
    if not shards:  # a rank without peers
        return torch.zeros(0, width, dtype=torch.long, device=device)
    padded = torch.nn.utils.rnn.pad_sequence([s.long() for s in shards], batch_first=True)
    return to_device(torch.nn.functional.pad(padded, (0, width - padded.shape[1])), device)


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """t (on the CPU) on device, without waiting for the device: through pinned memory to a GPU (a plain
    copy from pageable memory waits for the device's queue to drain, one stall per step)."""
    device = torch.device(device)
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def apply_step(flat: torch.Tensor, grad: torch.Tensor, active: torch.Tensor | None, opt: SGDSettings, lr: float,
               velocity: torch.Tensor | None, terms: StepTerms | None = None) -> None:
    """In-place SGD (torch semantics: buf = m*buf + g, dampening 0) on the trainable part of flat (the
    first grad.shape[1] columns; buffers are not stepped). active: (L,) bool on flat's device, the rows
    that step (the others keep their weights and momentum: a masked update, no gather and no wait for
    the device), or None where every row does. grad is consumed (modified in place)."""
    weights = flat[:, : grad.shape[1]]
    if opt.clip:
        norm = grad.norm(dim=1, keepdim=True)
        grad.mul_((opt.clip / (norm + 1e-6)).clamp(max=1.0))
    if terms is not None:
        terms.add_to(grad, weights, opt)
    if opt.weight_decay:
        grad.add_(weights, alpha=opt.weight_decay)
    mask = terms.mask if terms is not None else None
    if active is None:
        if velocity is not None:
            grad = velocity.mul_(opt.momentum).add_(grad)
        weights.add_(grad, alpha=-lr)
        if mask is not None:
            weights.mul_(mask)
        return
    keep = active[:, None]
    if velocity is not None:
        grad = velocity.mul(opt.momentum).add_(grad)
        velocity.copy_(torch.where(keep, grad, velocity))
    stepped = weights.add(grad, alpha=-lr)
    if mask is not None:
        stepped.mul_(mask)
    weights.copy_(torch.where(keep, stepped, weights))


@contextmanager
def one_torch_thread():
    """torch splits a small matrix product over its threads in a way that rounds differently with what
    else is in the batch: the hand-written MLP products run on one torch thread each (blocks of peers
    spread over the cores instead), so that each peer's arithmetic is the same whatever shares its
    batch, and so on any number of ranks."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


PEER_BLOCK = 24  # MLP peers trained together on a CPU: their weights stay in its cache for all their steps
STEP_COPIES = 6  # (D,) float32 arrays a peer's step holds beside its activations: weights, grads, velocity, slack


def peer_block(stack: PeerStack, peers: int, batch: int, sample_shape: tuple[int, ...]) -> int:
    """How many peers train as one batch. On the CPU, PEER_BLOCK MLPs (a cache's worth; blocks spread
    over the cores) or all the rank's other models. On a GPU, all the rank's peers, as many as fit in
    the rank's share of its free memory (stack.batch_budget) by their weights and a step's activations."""
    if not stack.batched:
        return 1
    if stack.device.type == "cpu":
        return PEER_BLOCK if stack.mlp is not None else peers
    per_peer = STEP_COPIES * 4 * stack.layout.size + batch * stack.activation_bytes(sample_shape)
    return max(1, min(peers, stack.batch_budget() // per_peer))


def train_epochs(stack: PeerStack, flat: torch.Tensor, shards: list[torch.Tensor], peers: list[int],
                 train_x: torch.Tensor, train_y: torch.Tensor, opt: SGDSettings, lr: float, seed: int,
                 round_index: int, terms: StepTerms | None = None) -> torch.Tensor:
    """opt.epochs epochs of minibatch SGD for every row of flat (L, D), in place; returns each peer's
    training loss, the mean of its minibatch losses over the call's steps (each taken before its step).
    Momentum starts from zero each call, as a fresh optimizer per round (the DFedAvgM reference code).
    With stack.batched false, peers train one after another without vmap (the per-peer baseline of the
    benchmark)."""
    size = peer_block(stack, len(peers), opt.batch_size, tuple(train_x.shape[1:]))
    blocks = [slice(i, i + size) for i in range(0, len(peers), size)]

    def train(b):
        return _train_block(stack, flat[b], shards[b], peers[b], train_x, train_y, opt, lr, seed, round_index,
                            terms.rows(b) if terms else None)

    if stack.mlp is None or stack.device.type != "cpu":
        return torch.cat([train(b) for b in blocks])
    threads = torch.get_num_threads()
    with one_torch_thread(), ThreadPoolExecutor(threads) as pool:
        return torch.cat(list(pool.map(train, blocks)))


def local_steps(n_samples: int, opt: SGDSettings) -> int:
    """How many SGD steps a peer with n samples takes in one call of train_epochs."""
    return opt.steps if opt.steps else opt.epochs * math.ceil(n_samples / opt.batch_size)


def _train_block(stack, flat, shards, peers, train_x, train_y, opt, lr, seed, round_index, terms) -> torch.Tensor:
    """The block's steps, an epoch's plan at a time (MinibatchPlan); nothing in a step waits for the
    device: which rows step is known on the CPU, and a row that does not step is masked on the device."""
    velocity = torch.zeros_like(flat[:, : stack.layout.trainable]) if opt.momentum else None
    loss_sum = torch.zeros(len(peers), device=flat.device)
    budget = torch.tensor([local_steps(len(s), opt) if len(s) else 0 for s in shards])
    plan = MinibatchPlan(shards, peers, opt.batch_size, seed, round_index, budget, flat.device)
    noise_keys = peer_keys(seed, "dropout", round_index, peers, flat.device) if stack.dropouts else None
    plain_mlp = _hand_written(stack) and terms is None and not (opt.momentum or opt.weight_decay or opt.clip
                                                                 or opt.prox_mu)
    epoch = 0
    while plan.unfinished():
        sizes, index, mask, active = plan.epoch(epoch)
        for s in range(len(index)):
            stopping.check()  # a stop at once ends a block in a pool thread within a step, not at its end
            stepping = int((sizes[s] > 0).sum())
            if not stepping:
                continue
            noise = stack.dropout_noise(noise_keys, opt.batch_size, epoch, s) if noise_keys is not None else None
            x = torch.index_select(train_x, 0, index[s].reshape(-1), out=stack.scratch(
                "batch", (index.shape[1] * index.shape[2], *train_x.shape[1:]), train_x))
            x = x.view(*index.shape[1:], *train_x.shape[1:])
            if plain_mlp:  # inactive peers have a zero mask, hence a zero step
                _, losses = _mlp_gradients(stack, flat, x, train_y[index[s]], mask[s], lr)
            else:
                grad, losses = gradients(stack, flat, x, train_y[index[s]], mask[s], noise,
                                         terms.contrast if terms else None, sizes[s])
                apply_step(flat, grad, None if stepping == len(peers) else active[s], opt, lr, velocity, terms)
            loss_sum += torch.where(active[s], losses, 0.0)
        epoch += 1
    return loss_sum / budget.clamp(min=1).to(flat.device)


def sample_batch(shards: list[torch.Tensor], batch: int, seed: int, round_index: int,
                 peers: list[int], device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """One minibatch per peer drawn without replacement: indices (L, B) and mask (L, B), on device; each
    peer's the first B of its keyed permutation (seed, 'batch', round, peer)."""
    device = torch.device(device)
    lengths = torch.tensor([len(s) for s in shards])
    width = max(batch, int(lengths.max()) if len(shards) else 1)
    padded = padded_shards(shards, width, device)
    order = keyed_orders(peer_keys(seed, "batch", round_index, peers, device), to_device(lengths, device),
                         width)[:, :batch]
    mask = (torch.arange(batch)[None] < lengths[:, None]).float()
    return padded.gather(1, order) * to_device(mask.long(), device), to_device(mask, device)


@torch.no_grad()
def candidate_losses(stack: PeerStack, candidates: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                     loss: str = "task", pixels=None) -> torch.Tensor:
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
def evaluate(stack: PeerStack, flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
             by_sample: bool = False) -> dict[str, torch.Tensor] | tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The task's metrics (accuracy and loss for classification) of each row of flat (L, D) on (x, y),
    averaged over the samples: {metric: (L,)}. by_sample: also each metric of each row, sample by sample
    {metric: (L, n)}, from which the precision of a mean over a subset of samples follows."""
    task = stack.task
    sums = {m: torch.zeros(len(flat), device=flat.device) for m in task.metrics}
    per_sample = {m: torch.zeros(len(flat), len(x), device=flat.device) if by_sample else None for m in task.metrics}
    peer_chunk, sample_chunk = evaluation_chunks(stack, len(flat), len(x), tuple(x.shape[1:]))
    for p in range(0, len(flat), peer_chunk):
        rows = flat[p:p + peer_chunk]
        for s in range(0, len(x), sample_chunk):
            xb, yb = x[s:s + sample_chunk], y[s:s + sample_chunk]
            outputs = stack.forward(rows, xb, shared_input=True)
            for m, values in task.per_sample(outputs, yb.expand(len(rows), *yb.shape)).items():
                sums[m][p:p + peer_chunk] += values.sum(1)
                if by_sample:
                    per_sample[m][p:p + peer_chunk, s:s + sample_chunk] = values
    means = {m: v / len(x) for m, v in sums.items()}
    return (means, per_sample) if by_sample else means
