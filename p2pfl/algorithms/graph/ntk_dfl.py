"""NTK-DFL (Thompson et al.): per-round averaging, Jacobian exchange, local NTK evolution.

A round, each step a phase on the transport:
1. 'average': peers average weights with neighbours (--mixing uniform, the reference code and the
   paper's Algorithm 2; sample-weighted is eq. 1). Skipped with --ntk-no-avg (fig. 6 ablation).
2. 'weights': each peer sends its averaged weights back to its neighbours.
3. 'jacobians': peer i sends neighbour j the Jacobian of f(X_i; w_j), its labels Y_i and outputs
   f(X_i; w_j), so j holds its whole neighbourhood's Jacobians taken at its own weights.
4. each peer evolves its weights with the NTK of its neighbourhood and keeps the best candidate t.
With Jacobian batching (--ntk-batches m1) steps 2-4 repeat m1 times per round, each on 1/m1 of
every peer's samples; with data subsampling (--ntk-subsample m2) peers use 1/m2 of their samples,
drawn anew each round.

Selection of t (--ntk-selection): 'network' = the true network's cross-entropy on the neighbourhood's
samples (the reference code; a simulator shortcut: it reads the neighbours' inputs from the shared
dataset copy, which a deployment would have to send); 'linearized' = the loss of the evolved outputs
(the paper's appendix-C wording; it falls with t, so it takes the largest candidate); 'own' = the true
loss on the peer's own samples (no neighbour inputs needed).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from p2pfl.algorithms.base import Algorithm, RunContext, neighbour_average
from p2pfl.algorithms.ntk_options import GB, JacobianMessage, NTKOptions, check_memory, make_codec, project_inputs
from p2pfl.options import option, positive
from p2pfl.comm import Message, Weights
from p2pfl.errors import UserError
from p2pfl.final_averaging import final_averaging
from p2pfl.ntk.codec import tau_histogram
from p2pfl.ntk.pixels import PixelInputs
from p2pfl.ntk.step import NTKProblem, evolves_batched, ntk_steps
from p2pfl.report import plot_final_averaging
from p2pfl.seeding import numpy_rng
from p2pfl.training import candidate_losses


EVOLVE_CHUNK = 8  # peers whose kernels are held at once on the CPU: their evolutions share the cores
JACOBIAN_COPIES = 3  # of a group's dense Jacobians on a rank under MPI: sent, received, stacked
JACOBIAN_COPIES_ONE_RANK = 2  # in one process a message is the receiver's copy: computed and stacked
KERNEL_COPIES = 4  # (N, N) float32 arrays a batched evolution holds per neighbourhood (kernel, padded, scaled, slack)
INPUTS_CACHE_BYTES = 256 * 2**20  # the inputs' codes or Grams a rank keeps (94 or 48 MB at 300 peers x 200 samples)


@dataclass(frozen=True)
class NTKDFLSettings(NTKOptions):
    ntk_batches: int = option(1, "Jacobian batching m1: evolve m1 times a round, each on 1/m1 of the samples",
                              positive)
    ntk_subsample: int = option(1, "data subsampling m2: peers use 1/m2 of their samples each round", positive)
    ntk_no_avg: bool = option(False, "skip the per-round weight averaging (ablation of fig. 6)")


class NTKDFL(Algorithm):
    name = "ntk-dfl"
    summary = "NTK-DFL: averaging, Jacobian exchange, local NTK evolution"
    Settings = NTKDFLSettings
    pooled_state = ("taus_chosen",)
    tasks = ("classification",)
    # the paper's lr 0.01 without decay (appendix B.2 states none; the reference code's exp(-0.07 k) went
    # with t = 100 alone): with the candidates 100..800 it reaches 85% in 18-22 rounds on three seeds, not 30 (README)
    training = {"lr": 0.01, "lr_decay": 0.0}

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        self.step_settings = self.settings.step_settings()
        self.codec = make_codec(ctx, self.settings)
        self.batches = self.settings.ntk_batches
        self.subsample = self.settings.ntk_subsample
        self.taus_chosen: list[int] = []  # every peer step's t, for final.json
        self.round_taus: list[int] = []  # this round's, for its metrics row
        # what the factored kernel reuses of each peer's inputs (see block_inputs): in the kernel of every
        # neighbourhood the peer belongs to, and unchanged while its samples are; keyed by (peer, its sample indices)
        self.block_cache: dict[tuple[int, bytes], PixelInputs | torch.Tensor] = {}
        self.block_cache_bytes = 0
        if ctx.cfg.test_samples is not None and ctx.cfg.test_samples < 2:
            raise UserError(f"--test-samples {ctx.cfg.test_samples}: NTK-DFL's final averaging splits the test samples "
                            "into validation and test halves and needs at least 2")
        smallest = min(len(s) for s in ctx.shards)
        if self.batches * self.subsample > smallest:
            raise UserError(f"--ntk-batches {self.batches} x --ntk-subsample {self.subsample} exceeds the {smallest} "
                            "samples of the smallest peer: every Jacobian batch needs at least one sample")
        graph = ctx.schedule.graph(0)
        per_peer = max(len(s) for s in ctx.shards) // self.subsample
        largest_hood = (max(d for _, d in graph.degree()) + 1) * math.ceil(per_peer / self.batches)
        # Jacobians are held a group of neighbourhoods at a time (receiver_groups): one must fit the cap
        self.copies = JACOBIAN_COPIES_ONE_RANK if ctx.transport.size == 1 else JACOBIAN_COPIES
        check_memory(self.codec, self.settings, ctx.data.n_classes, largest_hood, self.copies,
                     "one neighbourhood's (the largest of the first round's graph)")
        stacked = largest_hood * ctx.data.n_classes * self.codec.n_params * 4 if self.codec.path == "dense" else 0
        self.chunk = evolve_chunk(self.step_settings, KERNEL_COPIES * 4 * largest_hood ** 2 + stacked, len(ctx.peers),
                                  ctx.stack)

    @classmethod
    def check(cls, cfg) -> None:
        if cfg.settings.ntk_selection == "validation":
            raise UserError("--ntk-selection validation is NTK-FL's and CP-NTK-FL's (a server's held-out clients); "
                            "NTK-DFL has network, linearized or own")

    def notes(self) -> list[str]:
        if self.codec.path != "dense":
            return []
        graph = self.ctx.schedule.graph(0)
        hood = {p: sorted(list(graph.neighbors(p)) + [p]) for p in range(self.ctx.cfg.peers)}
        groups = self.receiver_groups(0, hood)
        hood_bytes = [self.jacobian_bytes(sum(self.batch_size(0, j) for j in hood[p])) for p in range(len(hood))]
        # the groups' copies, and one neighbourhood's transients (J^T R rearranges a stacked Jacobian)
        held = max(sum(self.copies * hood_bytes[p] for p in group) for group in groups) + max(hood_bytes)
        return [f"ntk-dfl: dense Jacobians of at most {max(map(len, groups))} neighbourhoods held at once "
                f"({len(groups)} Jacobian exchange{'s' if len(groups) > 1 else ''} in round 1): about "
                f"{held / GB:.2f} GiB on a rank, within --ntk-memory-gb {self.settings.ntk_memory_gb:g}"]

    @classmethod
    def prepare_data(cls, data, cfg):
        project_inputs(data, cfg)

    def samples(self, round_index: int, peer: int) -> list[torch.Tensor]:
        """The peer's training indices used this round, split into the m1 Jacobian batches."""
        shard = self.ctx.shards[peer].numpy()
        if self.subsample > 1:
            keep = max(1, len(shard) // self.subsample)
            shard = np.sort(numpy_rng(self.ctx.cfg.seed, "subsample", round_index, peer).choice(shard, keep, False))
        parts = np.array_split(shard, min(self.batches, len(shard)))
        return [torch.from_numpy(parts[b % len(parts)]) for b in range(self.batches)]

    def round(self, round_index: int) -> torch.Tensor:
        ctx = self.ctx
        graph = ctx.schedule.graph(round_index)
        hood = {p: sorted(list(graph.neighbors(p)) + [p]) for p in range(ctx.cfg.peers)}
        weights = ctx.flat if self.settings.ntk_no_avg else neighbour_average(ctx, round_index, ctx.flat)
        data = {p: self.samples(round_index, p) for p in set(q for p in ctx.peers for q in hood[p])}
        used = {(p, index.numpy().tobytes()) for p, parts in data.items() for index in parts}
        self.block_cache = {key: kept for key, kept in self.block_cache.items() if key in used}
        self.block_cache_bytes = sum(_nbytes(kept) for kept in self.block_cache.values())
        self.round_taus = []
        losses = torch.zeros(len(ctx.peers), device=ctx.device)
        for b in range(self.batches):
            batch = {p: d[b] for p, d in data.items()}
            losses = self.evolve_batch(round_index, graph, hood, weights, batch, on_device(batch, ctx.device))
            weights = ctx.flat
        return losses

    def evolve_batch(self, round_index, graph, hood, weights, data, placed) -> torch.Tensor:
        """Steps 2-4 on one Jacobian batch: data, each peer's sample indices (on the CPU: the inputs
        cache's keys), and placed, the same on the device (moved in one copy)."""
        ctx = self.ctx
        eta = ctx.lr(round_index)
        row = {p: i for i, p in enumerate(ctx.peers)}
        n_classes = ctx.data.n_classes
        online = [ctx.peers[i] for i in ctx.online_rows(round_index)]
        # 'weights': every peer's neighbours learn the weights their Jacobians are to be taken at
        msgs = [Message(p, j, Weights(weights[row[p]])) for p in ctx.peers for j in graph.neighbors(p)]
        heard = ctx.transport.exchange("weights", round_index, msgs,
                                       [(j, p) for p in ctx.peers for j in graph.neighbors(p)], Weights)
        new = ctx.flat.clone()
        losses = torch.full((len(ctx.peers),), math.nan, device=ctx.device)  # NaN: offline this round
        for group in self.receiver_groups(round_index, hood):
            own, inbox = self.exchange_jacobians(round_index, graph, weights, heard, placed, online, group)
            receivers = [p for p in online if p in group]
            for chunk in range(0, len(receivers), self.chunk):
                peers = receivers[chunk:chunk + self.chunk]
                members = {p: [j for j in hood[p] if j == p or j in inbox[p]] for p in peers}  # what arrived
                problems = [self.problem(p, members[p], own, inbox, weights[row[p]], data, placed) for p in peers]
                results = ntk_steps(problems, self.codec.shape, n_classes, eta, self.step_settings)
                for p, result in zip(peers, results):
                    new[row[p]] = result.weights
                    losses[row[p]] = result.losses.min()
                    self.taus_chosen.append(result.tau)
                    self.round_taus.append(result.tau)
                del problems, results  # a chunk's stacked Jacobians go before the next chunk's are stacked
            del own, inbox  # this group's Jacobians go before the next group's come
        ctx.flat = new
        return losses

    def exchange_jacobians(self, round_index, graph, weights, heard, data, online, group: set[int]):
        """'jacobians' for the receivers in group: peer i sends each neighbour j in group the Jacobian of
        its samples at j's weights (where they reached i), its outputs and labels; i in group keeps its
        own at its weights. Returns (own, inbox)."""
        ctx = self.ctx
        row = {p: i for i, p in enumerate(ctx.peers)}
        own, msgs = {}, []
        for i in online:
            x, y = ctx.rows(data[i])
            if i in group:
                jac, f = self.codec.compute(weights[row[i]], x)
                own[i] = (jac, f.detach(), y)
            for j, w in heard[i].items():
                if j in group:
                    jac, f = self.codec.compute(w.weights, x)
                    payload, dense = JacobianMessage.of(self.codec, jac, f, y)
                    msgs.append(Message(i, j, payload, dense_nbytes=dense))
        expect = [(j, p) for p in ctx.peers if p in group for j in graph.neighbors(p)
                  if ctx.transport.delivered(round_index, p, j, "weights")]  # j answers only if p's weights reached it
        return own, ctx.transport.exchange("jacobians", round_index, msgs, expect, JacobianMessage)

    def receiver_groups(self, round_index: int, hood: dict[int, list[int]]) -> list[set[int]]:
        """The peers whose neighbourhoods' Jacobians are exchanged and evolved together, in peer order and
        the same on every rank: all of them where Jacobians are factored (small); with dense Jacobians, as
        many neighbourhoods as fit --ntk-memory-gb with the copies a rank holds of them (sent, received,
        stacked), so that a rank holds about one group's at a time, not all of the round's."""
        peers = range(self.ctx.cfg.peers)
        if self.codec.path != "dense":
            return [set(peers)]
        cap, groups, load = self.settings.ntk_memory_gb * GB, [], math.inf
        for p in peers:
            need = self.copies * self.jacobian_bytes(sum(self.batch_size(round_index, j) for j in hood[p]))
            if load + need > cap:
                groups.append(set())
                load = 0
            groups[-1].add(p)
            load += need
        return groups

    def jacobian_bytes(self, samples: int) -> int:
        return samples * self.ctx.data.n_classes * self.codec.n_params * 4

    def batch_size(self, round_index: int, peer: int) -> int:
        """How many samples peer uses in each of this round's Jacobian batches (the largest of them)."""
        keep = len(self.ctx.shards[peer])
        keep = max(1, keep // self.subsample) if self.subsample > 1 else keep
        return math.ceil(keep / min(self.batches, keep))

    def gathered_fields(self, round_index: int) -> dict | None:
        """ntk_t_hist: how many peer steps of the round chose each candidate t, over all peers."""
        chosen = self.ctx.transport.gather(self.round_taus)
        return None if chosen is None else {"ntk_t_hist": tau_histogram([t for part in chosen for t in part])}

    def problem(self, peer, hood, own, inbox, w, data, placed) -> NTKProblem:
        """Peer's evolution over its neighbourhood: its own Jacobian and the ones it received, stacked."""
        ctx = self.ctx
        parts = [own[peer] if j == peer else inbox[peer][j].read(self.codec) for j in hood]
        blocks = [self.block_inputs(j, part[0], data[j]) for j, part in zip(hood, parts)] \
            if self.codec.path == "factored" else [None] * len(hood)
        pixels = PixelInputs.cat(blocks) if all(isinstance(b, PixelInputs) for b in blocks) else None
        grams = None if pixels is not None else [b if isinstance(b, torch.Tensor) else None for b in blocks]
        jac = self.codec.cat([part[0] for part in parts], grams, pixels)
        f0 = torch.cat([part[1] for part in parts])
        labels = torch.cat([part[2] for part in parts])
        # the selection's samples are the neighbourhood's, or the peer's own block of them
        selection_pixels = None if pixels is None else pixels if self.settings.ntk_selection != "own" \
            else blocks[hood.index(peer)]
        selection_x, selection_y = self.selection_data(peer, hood, placed, selection_pixels is None)
        return NTKProblem(jac, w, f0, labels, lambda cands: candidate_losses(
            ctx.stack, cands, selection_x, selection_y, self.settings.ntk_loss, selection_pixels))

    def block_inputs(self, peer: int, jac, index: torch.Tensor) -> PixelInputs | torch.Tensor:
        """What the kernel reuses of the peer's inputs for these samples (as received, the Jacobian's
        first factor): their 8-bit pixel codes where they are pixels (exact integer products,
        p2pfl.ntk.pixels), else their Gram; from the cache, or computed (and kept, within budget)."""
        key = (peer, index.numpy().tobytes())
        kept = self.block_cache.get(key)
        if kept is None:
            kept = PixelInputs.encode(jac.acts[0], self.ctx.data.pixel_levels)
            if kept is None:
                kept = jac.input_gram()
            if self.block_cache_bytes + _nbytes(kept) <= INPUTS_CACHE_BYTES:
                self.block_cache[key] = kept
                self.block_cache_bytes += _nbytes(kept)
        return kept

    def selection_data(self, peer, hood, data, inputs: bool = True):
        """The selection's inputs (None where not wanted: the pixel codes stand for them) and labels."""
        members = [peer] if self.settings.ntk_selection == "own" else hood
        index = torch.cat([data[j] for j in members])
        if inputs:
            return self.ctx.rows(index)
        return None, self.ctx.data.train_y[index.to(self.ctx.device)]

    def finish(self, run_dir) -> dict | None:
        result = final_averaging(self.ctx)
        chosen = self.ctx.transport.gather(self.taus_chosen)
        if result is not None:
            taus = [t for part in chosen for t in part]
            result["tau_histogram"] = tau_histogram(taus)
            if run_dir is not None:
                plot_final_averaging(result, run_dir / "final_averaging.png")
        return result


def evolve_chunk(settings, hood_bytes: int, peers: int, stack) -> int:
    """How many peers' evolutions are held at once: EVOLVE_CHUNK on the CPU; on a GPU, one batch of all
    the rank's peers where the rank's batch budget (stack.batch_budget) holds their kernels (and
    stacked dense Jacobians), else as many as it does."""
    if not evolves_batched(stack.device, settings):
        return EVOLVE_CHUNK
    return max(1, min(peers, stack.batch_budget() // max(1, hood_bytes)))


def on_device(indices: dict[int, torch.Tensor], device: torch.device) -> dict[int, torch.Tensor]:
    """The same index tensors on device, in one copy (one per peer was about 900 copies a round)."""
    keys = list(indices)
    if not keys:
        return {}
    moved = torch.cat([indices[k] for k in keys]).to(device).split([len(indices[k]) for k in keys])
    return dict(zip(keys, moved))


def _nbytes(kept: PixelInputs | torch.Tensor) -> int:
    return kept.nbytes if isinstance(kept, PixelInputs) else kept.numel() * kept.element_size()
