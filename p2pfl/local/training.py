"""Local SGD for a rank's peers, all peers in one batch.

Peers hold different numbers of samples, so a step carries a (peers, batch) mask: padded rows add
nothing to the loss and a peer without a batch at this step is left untouched (weights and momentum),
which makes the batched run equal, peer by peer, to training each peer alone.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from p2pfl import stopping
from p2pfl.local.gradients import (
    Contrast,
    PrivateStep,
    gradients,
    hand_written,
    mlp_gradients,
    one_torch_thread,
    private_gradients,
    to_device,
)
from p2pfl.models.stack import PeerStack
from p2pfl.seeding import keyed_orders, peer_keys


@dataclass(frozen=True)
class SGDSettings:
    """Local SGD's settings; the round's learning rate travels beside them (it decays with the round)."""

    batch_size: int
    epochs: int = 1
    momentum: float = 0.0
    weight_decay: float = 0.0
    steps: int | None = None  # a fixed number of local steps instead of epochs
    prox_mu: float = 0.0  # FedProx: gradient of (mu/2)||w - anchor||^2 added to each step
    clip: float = 0.0  # the largest 2-norm of a peer's loss gradient (torch's clip_grad_norm_); 0: off
    dp_clip: float = 0.0  # DP-SGD (PrivateStep): the largest 2-norm of a sample's gradient; 0: off
    dp_noise: float = 0.0  # DP-SGD: the noise's standard deviation, in units of dp_clip


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
        return StepTerms(
            pick(self.anchor), pick(self.offset), self.contrast.rows(index) if self.contrast else None, pick(self.mask)
        )

    def add_to(self, grad: torch.Tensor, flat: torch.Tensor, opt: SGDSettings) -> None:
        width = grad.shape[-1]  # the trainable part
        if self.anchor is not None and opt.prox_mu:
            grad.add_(flat - self.anchor[..., :width], alpha=opt.prox_mu)
        if self.offset is not None:
            grad.add_(self.offset[..., :width])


class MinibatchPlan:
    """A block's minibatches for one call of local training (a round), drawn where the weights live.

    Each peer's epoch order is a keyed permutation (p2pfl.seeding.keyed_orders) of its shard, keyed by
    (seed, 'shuffle', round, peer) and the epoch: the same on every layout and device, and made on the
    device in a few kernels for all the block's peers (per-peer generators on the CPU took 11.6 ms an
    epoch at 300 peers, more than the GPU's steps). Which peers step at which step follows from the
    shard sizes and step budgets alone, so that part is known on the CPU without asking the device."""

    def __init__(
        self,
        shards: list[torch.Tensor],
        peers: list[int],
        batch: int,
        seed: int,
        round_index: int | list[int],
        budget: torch.Tensor,
        device: torch.device,
    ):
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


def apply_step(
    flat: torch.Tensor,
    grad: torch.Tensor,
    active: torch.Tensor | None,
    opt: SGDSettings,
    lr: float,
    velocity: torch.Tensor | None,
    terms: StepTerms | None = None,
) -> None:
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


def train_epochs(
    stack: PeerStack,
    flat: torch.Tensor,
    shards: list[torch.Tensor],
    peers: list[int],
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    opt: SGDSettings,
    lr: float,
    seed: int,
    round_index: int | list[int],
    terms: StepTerms | None = None,
) -> torch.Tensor:
    """opt.epochs epochs of minibatch SGD for every row of flat (L, D), in place; returns each peer's
    training loss, the mean of its minibatch losses over the call's steps (each taken before its step).
    Momentum starts from zero each call, as a fresh optimizer per round (the DFedAvgM reference code).
    round_index keys the minibatches: one for all, or one per peer (an asynchronous run's step counts).
    With stack.batched false, peers train one after another without vmap (the per-peer baseline of the
    benchmark)."""
    size = peer_block(stack, len(peers), opt.batch_size, tuple(train_x.shape[1:]))
    blocks = [slice(i, i + size) for i in range(0, len(peers), size)]

    def train(b):
        return _train_block(
            stack,
            flat[b],
            shards[b],
            peers[b],
            train_x,
            train_y,
            opt,
            lr,
            seed,
            round_index[b] if isinstance(round_index, list) else round_index,
            terms.rows(b) if terms else None,
        )

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
    plain_mlp = (
        hand_written(stack)
        and terms is None
        and not (opt.momentum or opt.weight_decay or opt.clip or opt.prox_mu or opt.dp_clip)
    )
    epoch = 0
    while plan.unfinished():
        sizes, index, mask, active = plan.epoch(epoch)
        for s in range(len(index)):
            stopping.check()  # a stop at once ends a block in a pool thread within a step, not at its end
            stepping = int((sizes[s] > 0).sum())
            if not stepping:
                continue
            noise = stack.dropout_noise(noise_keys, opt.batch_size, epoch, s) if noise_keys is not None else None
            x = torch.index_select(
                train_x,
                0,
                index[s].reshape(-1),
                out=stack.scratch("batch", (index.shape[1] * index.shape[2], *train_x.shape[1:]), train_x),
            )
            x = x.view(*index.shape[1:], *train_x.shape[1:])
            if plain_mlp:  # inactive peers have a zero mask, hence a zero step
                _, losses = mlp_gradients(stack, flat, x, train_y[index[s]], mask[s], lr)
            else:
                if opt.dp_clip:  # each sample's gradient clipped, the sum noised (DP-SGD)
                    rounds = round_index if isinstance(round_index, list) else [round_index] * len(peers)
                    keys = [(seed, "dp-noise", r, p, epoch, s) for r, p in zip(rounds, peers)]
                    step = PrivateStep(opt.dp_clip, opt.dp_noise, opt.batch_size, keys)
                    grad, losses = private_gradients(stack, flat, x, train_y[index[s]], mask[s], step)
                else:
                    grad, losses = gradients(
                        stack, flat, x, train_y[index[s]], mask[s], noise, terms.contrast if terms else None, sizes[s]
                    )
                apply_step(flat, grad, None if stepping == len(peers) else active[s], opt, lr, velocity, terms)
            loss_sum += torch.where(active[s], losses, 0.0)
        epoch += 1
    return loss_sum / budget.clamp(min=1).to(flat.device)


def sample_batch(
    shards: list[torch.Tensor],
    batch: int,
    seed: int,
    round_index: int,
    peers: list[int],
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """One minibatch per peer drawn without replacement: indices (L, B) and mask (L, B), on device; each
    peer's the first B of its keyed permutation (seed, 'batch', round, peer)."""
    device = torch.device(device)
    lengths = torch.tensor([len(s) for s in shards])
    width = max(batch, int(lengths.max()) if len(shards) else 1)
    padded = padded_shards(shards, width, device)
    order = keyed_orders(peer_keys(seed, "batch", round_index, peers, device), to_device(lengths, device), width)[
        :, :batch
    ]
    mask = (torch.arange(batch)[None] < lengths[:, None]).float()
    return padded.gather(1, order) * to_device(mask.long(), device), to_device(mask, device)
