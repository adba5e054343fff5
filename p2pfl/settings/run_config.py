"""The run's own settings, declared once: default, help and check of each (p2pfl.settings.fields). The flags, the
TOML keys, the per-setting checks and the docs' table are derived from these declarations; checks that
relate settings to each other, to the algorithm or to the data are p2pfl.runner.configure's."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import torch

from p2pfl.settings.fields import at_least, non_negative, option, positive, positive_or_auto, probability
from topologies import EXPONENTIAL_FORMS, MIXINGS

PARTITIONS = ("dirichlet", "iid", "classes", "writers")
AGGREGATES = ("uniform", "sample-weighted")
TRAINING_FALLBACK = {
    "lr_decay": 0.0,
    "momentum": 0.0,
    "local_epochs": 1,
    "weight_decay": 0.0,
}  # where an algorithm names none
ALGORITHM_S = "the algorithm's"  # how --help states a training default that each algorithm sets
CHECKPOINT_SECONDS = 30.0  # the default --checkpoint-every: after a round when this long has passed


def _device(v) -> str | None:
    return (
        None
        if v in ("auto", "cpu", "cuda") or (v.startswith("cuda:") and v[5:].isdigit())
        else f"{v} is an unknown device; use auto, cpu, cuda or cuda:N"
    )


def _seed(v) -> str | None:
    return None if 0 <= v < 2**63 else f"must be a whole number in [0, 2^63), got {v}"


def _widths(v) -> str | None:
    return None if v and all(w >= 1 for w in v) else f"needs at least one positive width, got {list(v)}"


def _alpha(v) -> str | None:
    return None if v > 0 else f"must be a positive number, got {v}"


def _momentum(v) -> str | None:
    return None if 0 <= v < 1 else f"must be in [0, 1), got {v}"


def _checkpoints(v) -> str | None:
    return None if v >= 0 else f"must be 0 (never) or a number of rounds, got {v}"


def _not_faster(v) -> str | None:
    return None if v >= 1 else f"must be at least 1 (a straggler is not faster), got {v}"


def _delta(v) -> str | None:
    return None if 0 < v < 1 else f"must be in (0, 1), got {v}"


def _bound(v) -> str | None:
    return None if v == "auto" or (v >= 0 and v == int(v)) else f"must be a whole number of peers or auto, got {v}"


def _deadline(v) -> str | None:
    return None if v >= 1 else f"must be at least 1 (the time a peer's work takes), got {v}"


@dataclass
class RunConfig:
    algo: str = option("dfedavg", "the algorithm;")
    peers: int | None = option(
        None,
        "number of peers; they sit on ranks in contiguous blocks",
        at_least(1),
        shown="MPI world size, or 10 without MPI",
    )
    rounds: int | None = option(
        None, "communication rounds", at_least(1), shown="the algorithm's, or what its stages add up to"
    )
    topology: str = option("regular", "the graph;")
    topology_file: str | None = option(
        None,
        "read one static graph from this file (edge list .txt/.edges/.edgelist 'u v [weight]', adjacency list "
        ".adjlist, GraphML .graphml, GML .gml); its node labels are the peers 0..P-1",
        shown="none",
    )
    kappa: float = option(
        5, "degree for regular and small-world (small-world's default 4), mean degree for erdos-renyi"
    )
    torus_sides: str = option(
        "", "torus: its sides as RxC, e.g. 4x8", shown="the factors of the peers nearest a square"
    )
    rewire: float = option(0.1, "small-world: the probability that each lattice edge is rewired (Watts-Strogatz beta)")
    exponential_form: str = option(
        "directed",
        "exponential: directed (i sends to i + 2^j, as Ying et al.) or symmetric (its undirected closure)",
        choices=EXPONENTIAL_FORMS,
        noun="exponential form",
    )
    static: bool = option(False, "one graph for the whole run instead of a new one each round")
    topology_window: int = option(
        1,
        "a function's graphs need be connected only over each window of N rounds, together (random matchings: "
        "N of about log2 peers); checked over the first window before any work and at the end of each",
        at_least(1),
    )
    mixing: str | None = option(
        None,
        "neighbour averaging weights: uniform 1/(deg+1), metropolis (doubly stochastic: the peers' mean is kept), "
        "sample-weighted, or given (the weights on the edges of --topology-file or of your function's graph); "
        "a directed graph takes uniform where this is not given",
        choices=MIXINGS,
        noun="mixing",
        shown="the algorithm's: metropolis, uniform for ntk-dfl (its paper's)",
    )
    dataset: str = option("fashion-mnist", "the dataset;")
    data_dir: str | None = option(None, "folder holding the dataset files", shown="the dataset's usual place")
    labels: str = option(
        "fine", "CIFAR-100 label set: fine (100 classes) or coarse (20)", choices=("fine", "coarse"), noun="label set"
    )
    partition: str | None = option(
        None,
        "how the training set is split among the peers: dirichlet, iid, classes or writers "
        "(the dataset's natural split: FEMNIST writers, linear-rep clients)",
        choices=PARTITIONS,
        noun="partition",
        shown="the dataset's: dirichlet, writers for femnist and linear-rep",
    )
    partition_file: str | None = option(
        None,
        "read each peer's training indices from this file instead of drawing "
        'them: .json ({"0": [indices], ...} or a list of lists), .npz (an array per '
        "peer) or the NTK-FL/NTK-DFL reference codes' pickled dict (read without running "
        "code); the run's P peers take the file's peers 0..P-1",
        shown="none: drawn",
    )
    dirichlet_style: str = option(
        "per-peer",
        "per-peer (NTK-FL/NTK-DFL: a label mix per peer, fixed size, samples "
        "may repeat across peers), per-class (NIID-Bench: each class split over the peers, "
        "disjoint) or feddyn (FedDyn: a class prior per peer, equal sizes, disjoint)",
        choices=("per-peer", "per-class", "feddyn"),
        noun="Dirichlet style",
    )
    classes_style: str = option(
        "random",
        "--partition classes: random (#C random classes, equal counts) or "
        "niid-bench (peer i owns class i mod C plus #C-1 random ones, whole classes split "
        "evenly)",
        choices=("random", "niid-bench"),
        noun="classes style",
    )
    alpha: float = option(0.1, "Dirichlet concentration", _alpha)
    classes_per_peer: int = option(2, "classes per peer for --partition classes", at_least(1))
    samples_per_peer: int = option(200, "training samples per peer", at_least(1))
    train_samples: int | None = option(
        None,
        "partition a seeded random subset of N training samples; it "
        "reduces partitions that use the whole set (niid-bench, per-class)",
        at_least(1),
        shown="all",
    )
    test_samples: int | None = option(None, "evaluate on the first N test samples", at_least(1), shown="all")
    client_test_samples: int | None = option(
        None,
        "score each client's model on its own subset of this many of those test samples, drawn from --seed "
        "and the peer, each class in its share (the aggregated model always sees them all); default: enough "
        "that the clients' mean accuracy has a standard error of at most 0.2 points (62,500 / peers); the "
        "rows' client_acc_se states it; 0: all of them",
        non_negative,
        shown="62,500 / peers",
    )
    seed: int = option(0, "seed of every random choice", _seed)
    out: str | None = option(
        None, "run folder; one that already holds files is refused (exit 2) before any work", shown="runs/<algo>-<time>"
    )
    overwrite: bool = option(False, "write into a non-empty --out, replacing the run files there")
    device: str = option(
        "auto", "auto (a GPU by local rank modulo the GPUs present, else the CPU), cpu, cuda or cuda:N", _device
    )
    tf32: bool = option(
        False,
        "on a GPU, let matrix products and convolutions round their inputs to TF32 (faster on tensor cores, about "
        "3 decimal digits per input); default IEEE float32 throughout, as the CPU",
    )
    init: str = option(
        "same",
        "same (one initial model for all peers) or different (per-peer init)",
        choices=("same", "different"),
        noun="init",
    )
    model: str | None = option(None, "the model;", shown="the dataset's; mlp for (Fashion-)MNIST")
    hidden: list[int] = option(
        [100],
        "MLP hidden layer widths, e.g. 100 (the papers' 784-100-10) or 200,100",
        _widths,
        wanted="comma-separated layer widths such as 100 or 200,100",
    )
    norm: str = option(
        "batch", "resnet8/resnet18 normalisation: batch or group (2 groups)", choices=("batch", "group"), noun="norm"
    )
    rep_dim: int = option(5, "linear-rep model: representation dimension k", at_least(1))
    # Local training; None means "the algorithm's default" (its class's `training` table).
    lr: float | None = option(None, "learning rate", positive, shown=ALGORITHM_S)
    lr_decay: float | None = option(None, "lr_k = lr * exp(-decay * k)", non_negative, shown=ALGORITHM_S)
    batch_size: int | None = option(None, "local minibatch size", positive, shown=ALGORITHM_S)
    local_epochs: int | None = option(None, "local epochs per round", positive, shown=ALGORITHM_S)
    momentum: float | None = option(None, "SGD momentum", _momentum, shown=ALGORITHM_S)
    weight_decay: float | None = option(None, "SGD weight decay", non_negative, shown=ALGORITHM_S)
    aggregate: str = option(
        "uniform",
        "aggregated model: uniform or sample-weighted average of all peers",
        choices=AGGREGATES,
        noun="aggregate",
    )
    grad_norm: bool = option(
        False,
        "add grad_norm to evaluated rows: the norm of the gradient of the peers' whole training objective at their "
        "mean model (a full pass over every shard)",
    )
    eval_every: int = option(1, "evaluate every N rounds (the last round always)", at_least(1))
    save_edges: bool = option(False, "write each round's edge list to edges.jsonl")
    tensorboard: bool = option(
        False, "also write TensorBoard event files of the metrics (run folder/tensorboard; needs the tensorboard extra)"
    )
    batch: bool = option(True, "train a rank's peers as one vmap batch (--no-batch: one by one)")
    comm_timeout: float = option(600.0, "seconds to wait for a peer's message", positive)
    drop_peers: float = option(
        0.0, "simulated faults: probability that a peer is offline for a round (neither trains nor sends)", probability
    )
    drop_links: float = option(0.0, "simulated faults: probability that a message is lost", probability)
    slow_peers: float = option(0.0, "simulated faults: probability that a peer straggles in a round", probability)
    slow_factor: float = option(4.0, "a straggler's local work takes this many time units, a peer's 1", _not_faster)
    round_deadline: float = option(2.0, "messages arriving after this many simulated time units are dropped", _deadline)
    step_time: float | None = option(
        None,
        "network model: the seconds a local step takes (the virtual clock, sim_time_s)",
        positive,
        shown="none: a round's local work takes 1 s whatever its steps (the faults' unit clock)",
    )
    step_time_spread: float = option(
        0.0, "network model: each peer's step time times a log-normal factor (median 1) of this sigma", non_negative
    )
    slower_peers: float = option(
        0.0, "network model: this share of the peers, drawn from --seed, steps --slower-by times slower", probability
    )
    slower_by: float = option(10.0, "network model: how many times slower --slower-peers step", _not_faster)
    step_time_file: str | None = option(
        None,
        "network model: a CSV of 'peer,seconds' lines, every peer's step time (instead of --step-time)",
        shown="none",
    )
    peer_flops: float | None = option(
        None,
        "network model: a peer's device speed in FLOP/s; a local step takes the model's FLOPs for one minibatch's "
        "forward and backward pass over it (instead of --step-time)",
        positive,
        shown="none",
    )
    link_latency: float = option(
        0.0, "network model: the seconds a message takes on a link before its bytes", non_negative
    )
    link_bandwidth: float | None = option(
        None,
        "network model: a link's bytes per second (a message takes latency + bytes / bandwidth)",
        positive,
        shown="none: bytes take no time",
    )
    link_spread: float = option(
        0.0,
        "network model: each link's latency times, and bandwidth over, a log-normal factor (median 1) of this sigma",
        non_negative,
    )
    churn: float = option(
        0.0,
        "network model: this share of the peers, drawn from --seed, leave and come back (seeded on/off spans)",
        probability,
    )
    churn_online: float = option(20.0, "network model: a churning peer's mean seconds present at a time", positive)
    churn_offline: float = option(10.0, "network model: a churning peer's mean seconds away at a time", positive)
    availability_file: str | None = option(
        None,
        "network model: a CSV of 'peer,leave,return' lines, when peers are away (instead of --churn)",
        shown="none",
    )
    byzantine: float = option(
        0.0,
        "Byzantine peers: a count (2) or a share of the peers (0.1), drawn from --seed; every metric leaves them out",
        non_negative,
    )
    attack: str = option("sign-flip", "what the Byzantine peers send;")
    attack_scale: float | str = option(
        "auto",
        "the attack's size: gaussian's standard deviation, ipm's and dissensus's epsilon, alie's z; auto: each "
        "attack's paper's (200, 0.1, 1.5, z from the counts of peers and attackers)",
        positive_or_auto,
    )
    robust_aggregation: str = option("none", "how an honest peer averages its neighbours' weights;")
    robust_bound: float | str = option(
        "auto",
        "b, the Byzantine neighbours a robust rule withstands (trimmed from each side, Krum's f, the neighbours "
        "ClippedGossip clips); auto: the most any honest peer has in the round's graph, at least 1",
        _bound,
    )
    clip_radius: float | str = option(
        "auto",
        "ClippedGossip's clipping radius; auto: each peer's (b+1)-th largest distance to a neighbour (the authors' rule)",
        positive_or_auto,
    )
    dp_clip: float = option(
        0.0,
        "differential privacy (DP-SGD on every peer): each sample's gradient clipped to this 2-norm; 0: off",
        non_negative,
    )
    dp_noise: float = option(
        0.0,
        "differential privacy: Gaussian noise of this many --dp-clip added to each step's summed gradient",
        non_negative,
    )
    dp_delta: float = option(1e-5, "differential privacy: the delta at which each row's dp_epsilon is stated", _delta)
    checkpoint_every: int | None = option(
        None,
        "checkpoint every N rounds, 0 never",
        _checkpoints,
        shown=f"after a round when {CHECKPOINT_SECONDS:g} s have passed since the last checkpoint, and on Ctrl-C",
    )
    resume: str | None = option(
        None, "continue the run in this folder from its last checkpoint, with its config.toml", shown="none"
    )
    progress: bool = option(True, "a progress bar")
    drift_stop: bool = option(
        True,
        "stop, as a diverging run (exit 3), where the peers drift apart: their consensus distance 10 times over "
        "the last 50 rounds, rising in 45 of them (looked at from round 101)",
    )
    settings: Any = None  # the algorithm's own settings (an instance of its Settings dataclass)
    given: frozenset = frozenset()  # the settings the user gave (flags or TOML), not defaults
    algorithm: Any = None  # the algorithm's class, resolved from algo once (p2pfl.runner.configure)
    notes: tuple = ()  # facts of the resolved settings worth a line in the run header (a W that does not keep the mean)


NOT_SETTINGS = ("settings", "given", "algorithm", "notes")
# Settings that change no number of a run: a resume may give them anew.
RESULT_NEUTRAL = (
    "resume",
    "out",
    "overwrite",
    "comm_timeout",
    "progress",
    "checkpoint_every",
    "tensorboard",
    "drift_stop",
)


FIELDS = {f.name: f for f in dataclasses.fields(RunConfig) if f.name not in NOT_SETTINGS}


def machine_memory(device) -> tuple[str, int]:
    """(what, bytes): the memory a rank's tensors live in, its GPU's or this machine's."""
    device = torch.device(device)
    if device.type == "cuda":
        return str(device), torch.cuda.get_device_properties(device).total_memory
    return "this machine", os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
