"""How much of a round's NTK work a rank holds at once: dense Jacobians a group of neighbourhoods at a
time within --ntk-memory-gb, and evolutions a chunk of peers at a time."""

from __future__ import annotations

import math

from p2pfl.ntk.codec import JacobianCodec
from p2pfl.ntk.step import evolves_batched

GB = 1024**3
EVOLVE_CHUNK = 8  # peers whose kernels are held at once on the CPU: their evolutions share the cores
JACOBIAN_COPIES = 3  # of a group's dense Jacobians on a rank under MPI: sent, received, stacked
JACOBIAN_COPIES_ONE_RANK = 2  # in one process a message is the receiver's copy: computed and stacked
KERNEL_COPIES = 4  # (N, N) float32 arrays a batched evolution holds per neighbourhood (kernel, padded, scaled, slack)


class PlanError(ValueError):
    """A run whose NTK work cannot fit, in one line for its user (the algorithm reports it as a UserError)."""


def check_memory(
    codec: JacobianCodec, memory_gb: float, n_classes: int, samples_held: int, copies: int = 3, what: str = "one rank's"
) -> None:
    """Refuse a dense-Jacobian run whose Jacobians held at once (computed, sent, received and stacked:
    `copies` of each) would exceed --ntk-memory-gb."""
    if codec.path != "dense":
        return
    need = copies * samples_held * n_classes * codec.n_params * 4
    if need > memory_gb * GB:
        raise PlanError(
            f"dense Jacobians of {codec.n_params:,} parameters for {what} {samples_held:,} samples would "
            f"take about {need / GB:.1f} GB on one rank, above --ntk-memory-gb {memory_gb:g}; "
            "use fewer --samples-per-peer or --peers per rank, a larger cap, or, in NTK-DFL, --ntk-batches "
            "or --ntk-subsample"
        )


class JacobianPlan:
    """NTK-DFL's memory plan: each peer's samples per Jacobian batch (m1 batches of 1/m2 of its shard),
    the receiver groups whose dense Jacobians fit the cap, the evolution chunk, and whether a chunk's
    steps are one padded batch (batched). A run whose largest
    neighbourhood of the first graph cannot fit is refused before it starts."""

    def __init__(
        self,
        codec: JacobianCodec,
        settings,
        n_classes: int,
        shard_sizes: list[int],
        first_graph,
        ranks: int,
        stack,
        hosted: int,
    ):
        """settings: NTK-DFL's; shard_sizes: every peer's samples; first_graph: round 1's; hosted: this
        rank's peers; stack: the run's PeerStack (its device and batch budget)."""
        memory_gb, batches, subsample = settings.ntk_memory_gb, settings.ntk_batches, settings.ntk_subsample
        self.codec, self.memory_gb, self.n_classes = codec, memory_gb, n_classes
        self.batches, self.subsample, self.sizes = batches, subsample, shard_sizes
        degree = max(d for _, d in first_graph.degree())
        smallest = min(shard_sizes)
        if batches * subsample > smallest:
            raise PlanError(
                f"--ntk-batches {batches} x --ntk-subsample {subsample} exceeds the {smallest} "
                "samples of the smallest peer: every Jacobian batch needs at least one sample"
            )
        largest_hood = (degree + 1) * math.ceil(max(shard_sizes) // subsample / batches)
        self.copies = JACOBIAN_COPIES_ONE_RANK if ranks == 1 else JACOBIAN_COPIES
        check_memory(
            codec,
            memory_gb,
            n_classes,
            largest_hood,
            self.copies,
            "one neighbourhood's (the largest of the first round's graph)",
        )
        # a GPU's steps: a chunk of neighbourhoods as one padded batch where the Jacobians are factored (dense
        # ones go problem by problem, their evolutions still one batch)
        self.batched = codec.path == "factored" and evolves_batched(stack.device, settings.step_settings())
        stacked = largest_hood * n_classes * codec.n_params * 4 if codec.path == "dense" else 0
        if self.batched:  # a padded neighbourhood's factors and its candidates' work beside its kernels
            stacked = batched_hood_bytes(codec, largest_hood, len(settings.ntk_taus))
        self.chunk = evolve_chunk(
            settings.step_settings(), KERNEL_COPIES * 4 * largest_hood**2 + stacked, hosted, stack
        )

    def batch_size(self, peer: int) -> int:
        """How many samples peer uses in each of a round's Jacobian batches (the largest of them)."""
        keep = self.sizes[peer]
        keep = max(1, keep // self.subsample) if self.subsample > 1 else keep
        return math.ceil(keep / min(self.batches, keep))

    def jacobian_bytes(self, samples: int) -> int:
        return samples * self.n_classes * self.codec.n_params * 4

    def groups(self, hood: dict[int, list[int]]) -> list[set[int]]:
        """The peers whose neighbourhoods' Jacobians are exchanged and evolved together, in peer order and
        the same on every rank: all of them where Jacobians are factored (small); with dense Jacobians, as
        many neighbourhoods as fit --ntk-memory-gb with the copies a rank holds of them (sent, received,
        stacked), so that a rank holds about one group's at a time, not all of the round's."""
        if self.codec.path != "dense":
            return [set(hood)]
        cap, groups, load = self.memory_gb * GB, [], math.inf
        for p in sorted(hood):
            need = self.copies * self.jacobian_bytes(sum(self.batch_size(j) for j in hood[p]))
            if load + need > cap:
                groups.append(set())
                load = 0
            groups[-1].add(p)
            load += need
        return groups

    def note(self, hood: dict[int, list[int]]) -> list[str]:
        """The run header's line on the dense Jacobians of the first round (none where they are factored)."""
        if self.codec.path != "dense":
            return []
        groups = self.groups(hood)
        hood_bytes = [self.jacobian_bytes(sum(self.batch_size(j) for j in hood[p])) for p in range(len(hood))]
        # the groups' copies, and one neighbourhood's transients (J^T R rearranges a stacked Jacobian)
        held = max(sum(self.copies * hood_bytes[p] for p in group) for group in groups) + max(hood_bytes)
        return [
            f"ntk-dfl: dense Jacobians of at most {max(map(len, groups))} neighbourhoods held at once "
            f"({len(groups)} Jacobian exchange{'s' if len(groups) > 1 else ''} in round 1): about "
            f"{held / GB:.2f} GiB on a rank, within --ntk-memory-gb {self.memory_gb:g}"
        ]


def batched_hood_bytes(codec: JacobianCodec, samples: int, candidates: int) -> int:
    """What one neighbourhood of a padded batch (p2pfl.ntk.hood_batch) holds beside its kernels, float32:
    its factors (every layer's inputs and gates), and per candidate its weights, their J^T R and its
    largest layer's products (the first layer's weight gradient, the hidden outputs on every sample)."""
    widths = [inputs for _, inputs in codec.shape.dims] + [out for out, _ in codec.shape.dims[:-1]]
    largest = max(out * inputs for out, inputs in codec.shape.dims)
    hidden = max(out for out, _ in codec.shape.dims)
    return 4 * (samples * sum(widths) + candidates * (2 * codec.n_params + largest + samples * hidden))


def evolve_chunk(settings, hood_bytes: int, peers: int, stack) -> int:
    """How many peers' evolutions are held at once: EVOLVE_CHUNK on the CPU; on a GPU, one batch of all
    the rank's peers where the rank's batch budget (stack.batch_budget) holds their kernels (and
    stacked dense Jacobians), else as many as it does."""
    if not evolves_batched(stack.device, settings):
        return EVOLVE_CHUNK
    return max(1, min(peers, stack.batch_budget() // max(1, hood_bytes)))
