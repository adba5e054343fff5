"""Splitting a training set over peers: index arrays into the training set, one per peer.

Two Dirichlet styles exist in the papers:
- per-peer (NTK-FL / NTK-DFL): each peer draws a label mix q ~ Dir(alpha) and takes floor(n q_c) samples
  of class c from a reshuffled class pool; pools are never used up, so peers may share samples.
- per-class (NIID-Bench, used by TCT and CyclicFL): each class is split across peers by p ~ Dir(alpha);
  disjoint, sizes vary, redrawn until every peer holds at least min(10, n) samples.
- feddyn (FedDyn, used by FedAvg-FT): a class prior per peer, equal sizes, disjoint.
#C classes per peer comes as 'random' (#C random classes, equal counts) and 'niid-bench'.
"""

from __future__ import annotations

import numpy as np

from p2pfl.errors import UserError
from p2pfl.seeding import numpy_rng

MIN_PER_PEER = 10
MAX_TRIES = 1000


def _class_pools(labels: np.ndarray, n_classes: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.permutation(np.flatnonzero(labels == c)) for c in range(n_classes)]


def dirichlet_per_peer(labels, n_classes, peers, per_peer, alpha, rng) -> list[np.ndarray]:
    if per_peer > len(labels):
        raise UserError(f"--samples-per-peer {per_peer} is beyond the dataset's {len(labels)} training samples")
    pools = _class_pools(labels, n_classes, rng)
    shards = []
    for _ in range(peers):
        q = rng.dirichlet(np.full(n_classes, alpha))
        takes = [pools[c][: min(int(np.floor(per_peer * q[c])), len(pools[c]))] for c in range(n_classes)]
        shard = np.concatenate(takes)
        if shard.size == 0:  # tiny per_peer: at least the most likely class's first sample
            shard = pools[int(np.argmax(q))][:1]
        shards.append(np.sort(shard))
        pools = [rng.permutation(p) for p in pools]
    return shards


def _subset(labels, peers, per_peer, rng) -> np.ndarray:
    total = peers * per_peer
    if total > len(labels):
        raise UserError(
            f"{peers} peers x {per_peer} samples = {total} is beyond the dataset's "
            f"{len(labels)} training samples (disjoint partition)"
        )
    return rng.permutation(len(labels))[:total]


def dirichlet_per_class(labels, n_classes, peers, per_peer, alpha, rng) -> list[np.ndarray]:
    chosen = _subset(labels, peers, per_peer, rng)
    total, need = len(chosen), min(MIN_PER_PEER, per_peer)
    for _ in range(MAX_TRIES):
        shards: list[list[int]] = [[] for _ in range(peers)]
        for c in range(n_classes):
            members = rng.permutation(chosen[labels[chosen] == c])
            p = rng.dirichlet(np.full(peers, alpha))
            sizes = np.array([len(s) for s in shards])
            p = p * (sizes < total / peers)  # NIID-Bench balancing: full peers take no more
            p = p / p.sum() if p.sum() > 0 else np.full(peers, 1.0 / peers)
            cuts = (np.cumsum(p) * len(members)).astype(int)[:-1]
            for shard, part in zip(shards, np.split(members, cuts)):
                shard.extend(part.tolist())
        if min(len(s) for s in shards) >= need:
            return [np.sort(np.asarray(s, dtype=np.int64)) for s in shards]
    raise UserError(
        f"per-class Dirichlet split with alpha={alpha} left a peer with fewer than {need} samples "
        f"after {MAX_TRIES} tries; raise --alpha or --samples-per-peer"
    )


def iid(labels, n_classes, peers, per_peer, alpha, rng) -> list[np.ndarray]:
    chosen = _subset(labels, peers, per_peer, rng)
    return [np.sort(part) for part in np.split(chosen, peers)]


def classes_per_peer(labels, n_classes, peers, per_peer, classes, rng) -> list[np.ndarray]:
    if classes > n_classes:
        raise UserError(f"--classes-per-peer {classes} exceeds the dataset's {n_classes} classes")
    pools = _class_pools(labels, n_classes, rng)
    used = [0] * n_classes
    shards = []
    for _ in range(peers):
        mine = rng.choice(n_classes, size=classes, replace=False)
        counts = np.full(classes, per_peer // classes)
        counts[: per_peer % classes] += 1
        parts = []
        for c, k in zip(mine, counts):
            if used[c] + k > len(pools[c]):
                raise UserError(
                    f"--samples-per-peer {per_peer} with {classes} classes per peer is beyond the "
                    f"dataset: class {c} has only {len(pools[c])} samples for its peers"
                )
            parts.append(pools[c][used[c] : used[c] + k])
            used[c] += k
        shards.append(np.sort(np.concatenate(parts)))
    return shards


def niid_bench_classes(labels, n_classes, peers, classes, rng) -> list[np.ndarray]:
    """NIID-Bench's #C: client i owns class i mod C plus #C-1 other distinct random classes; each class is
    split evenly (array_split) over its owners, so the whole training set is used. With as many clients
    as classes and #C = 1, each client holds one whole class."""
    if classes > n_classes:
        raise UserError(f"--classes-per-peer {classes} exceeds the dataset's {n_classes} classes")
    owned = []
    for i in range(peers):
        mine = [i % n_classes]
        while len(mine) < classes:
            c = int(rng.integers(n_classes))
            if c not in mine:
                mine.append(c)
        owned.append(mine)
    shards: list[list[np.ndarray]] = [[] for _ in range(peers)]
    for c in range(n_classes):
        owners = [i for i in range(peers) if c in owned[i]]
        if owners:
            for i, part in zip(owners, np.array_split(rng.permutation(np.flatnonzero(labels == c)), len(owners))):
                shards[i].append(part)
    return [np.sort(np.concatenate(s)).astype(np.int64) for s in shards]


def dirichlet_feddyn(labels, n_classes, peers, per_peer, alpha, rng) -> list[np.ndarray]:
    """FedDyn's Dirichlet: a class prior per client ~ Dir(alpha), equal client sizes; samples are dealt
    one at a time to a random client that is not full, of a class drawn from its prior, redrawn while
    that class is used up (drawn here directly from the prior restricted to the classes left)."""
    total = peers * per_peer
    if total > len(labels):
        raise UserError(
            f"{peers} peers x {per_peer} samples = {total} is beyond the dataset's "
            f"{len(labels)} training samples (disjoint partition)"
        )
    priors = rng.dirichlet(np.full(n_classes, alpha), size=peers)
    pools = _class_pools(labels, n_classes, rng)
    left = np.array([len(p) for p in pools])
    need = np.full(peers, per_peer)
    shards: list[list[int]] = [[] for _ in range(peers)]
    while need.sum():
        open_peers = np.flatnonzero(need)
        i = int(open_peers[rng.integers(len(open_peers))])
        prior = priors[i] * (left > 0)
        c = int(rng.choice(n_classes, p=prior / prior.sum())) if prior.sum() > 0 else int(np.argmax(left))
        left[c] -= 1
        need[i] -= 1
        shards[i].append(int(pools[c][left[c]]))
    return [np.sort(np.asarray(s, dtype=np.int64)) for s in shards]


def by_writer(groups: np.ndarray | None, peers: int) -> list[np.ndarray]:
    """The dataset's natural split: peer i holds every training sample of owner i (FEMNIST's writers in
    id order, the linear-representation task's clients); with fewer peers than owners, the first ones."""
    if groups is None:
        raise UserError("--partition writers needs a dataset with a natural split (femnist, linear-rep)")
    owners = int(groups.max()) + 1
    if peers > owners:
        raise UserError(f"--partition writers: {peers} peers but the dataset has only {owners} writers")
    return [np.flatnonzero(groups == i).astype(np.int64) for i in range(peers)]


def partition(
    labels: np.ndarray,
    n_classes: int,
    peers: int,
    kind: str,
    *,
    per_peer: int = 200,
    alpha: float = 0.1,
    classes: int = 2,
    style: str = "per-peer",
    classes_style: str = "random",
    groups: np.ndarray | None = None,
    seed: int = 0,
) -> list[np.ndarray]:
    """Index arrays into the training set, one per peer; a pure function of its arguments."""
    rng = numpy_rng(seed, "partition")
    if kind == "writers":
        return by_writer(groups, peers)
    if kind == "iid":
        return iid(labels, n_classes, peers, per_peer, alpha, rng)
    if not np.issubdtype(labels.dtype, np.integer):
        raise UserError(f"--partition {kind} splits by class; a regression dataset takes iid or writers")
    if kind == "dirichlet":
        split = {"per-peer": dirichlet_per_peer, "per-class": dirichlet_per_class, "feddyn": dirichlet_feddyn}[style]
        return split(labels, n_classes, peers, per_peer, alpha, rng)
    if kind == "classes":
        if classes_style == "niid-bench":
            return niid_bench_classes(labels, n_classes, peers, classes, rng)
        return classes_per_peer(labels, n_classes, peers, per_peer, classes, rng)
    raise UserError(f"unknown partition {kind!r}")


def summary(shards: list[np.ndarray], labels: np.ndarray, n_classes: int) -> list[dict]:
    """Per peer: its sample count and, for classes, its class histogram (what partition.json holds)."""
    if not np.issubdtype(labels.dtype, np.integer):
        return [{"peer": i, "samples": int(len(s))} for i, s in enumerate(shards)]
    return [
        {"peer": i, "samples": int(len(s)), "classes": np.bincount(labels[s], minlength=n_classes).astype(int).tolist()}
        for i, s in enumerate(shards)
    ]
