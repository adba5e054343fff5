"""Splitting a training set over peers: index arrays into the training set, one per peer.

Two Dirichlet styles exist in the papers:
- per-peer (NTK-FL / NTK-DFL): each peer draws a label mix q ~ Dir(alpha) and takes floor(n q_c) samples
  of class c from a reshuffled class pool; pools are never used up, so peers may share samples.
- per-class (NIID-Bench, used by TCT): each class is split across peers by p ~ Dir(alpha); disjoint,
  sizes vary, redrawn until every peer holds at least min(10, n) samples.
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
        takes = [pools[c][:min(int(np.floor(per_peer * q[c])), len(pools[c]))] for c in range(n_classes)]
        shard = np.concatenate(takes)
        if shard.size == 0:  # tiny per_peer: at least the most likely class's first sample
            shard = pools[int(np.argmax(q))][:1]
        shards.append(np.sort(shard))
        pools = [rng.permutation(p) for p in pools]
    return shards


def _subset(labels, peers, per_peer, rng) -> np.ndarray:
    total = peers * per_peer
    if total > len(labels):
        raise UserError(f"{peers} peers x {per_peer} samples = {total} is beyond the dataset's "
                        f"{len(labels)} training samples (disjoint partition)")
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
    raise UserError(f"per-class Dirichlet split with alpha={alpha} left a peer with fewer than {need} samples "
                    f"after {MAX_TRIES} tries; raise --alpha or --samples-per-peer")


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
                raise UserError(f"--samples-per-peer {per_peer} with {classes} classes per peer is beyond the "
                                f"dataset: class {c} has only {len(pools[c])} samples for its peers")
            parts.append(pools[c][used[c]:used[c] + k])
            used[c] += k
        shards.append(np.sort(np.concatenate(parts)))
    return shards


def partition(labels: np.ndarray, n_classes: int, peers: int, kind: str, per_peer: int, alpha: float,
              classes: int, style: str, seed: int) -> list[np.ndarray]:
    """Index arrays into the training set, one per peer; a pure function of its arguments."""
    rng = numpy_rng(seed, "partition")
    if kind == "dirichlet":
        split = dirichlet_per_peer if style == "per-peer" else dirichlet_per_class
        return split(labels, n_classes, peers, per_peer, alpha, rng)
    if kind == "iid":
        return iid(labels, n_classes, peers, per_peer, alpha, rng)
    if kind == "classes":
        return classes_per_peer(labels, n_classes, peers, per_peer, classes, rng)
    raise UserError(f"unknown partition {kind!r}")


def summary(shards: list[np.ndarray], labels: np.ndarray, n_classes: int) -> list[dict]:
    """Per peer: its sample count and class histogram (what partition.json holds)."""
    return [{"peer": i, "samples": int(len(s)),
             "classes": np.bincount(labels[s], minlength=n_classes).astype(int).tolist()}
            for i, s in enumerate(shards)]
