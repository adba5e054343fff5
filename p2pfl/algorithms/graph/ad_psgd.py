"""AD-PSGD (Lian, Zhang, Zhang and Liu, ICML 2018, Algorithm 1), on the virtual clock: each peer, at its
own speed, repeatedly

    reads its weights x_i and computes a stochastic gradient g there;
    when done, picks a neighbour j at random and averages atomically: x_i, x_j <- (x_i + x_j) / 2;
    applies the gradient to what it now holds: x_i <- x_i - lr g   (stale: g was taken at the read).

Slow peers do not hold the fast ones back: a fast peer takes more steps and averages more often, and a slow
one's late gradient lands on weights its neighbours have moved since. The clock decides the order
(p2pfl.algorithms.asynchronous): the average takes effect when i's gradient is done, and i starts its next
read when both messages of the exchange have crossed the link (its latency and bandwidth, twice).

Compared with the authors' group's code (facebookresearch/stochastic_gradient_push, gossip/ad_psgd.py's
BilatGossipDataParallel): theirs splits peers into active and passive ones and averages in a separate
thread as often as the links allow, the gradients applied there by an SGD optimizer with momentum; this is
the paper's Algorithm 1 with plain SGD, one average a gradient, any neighbour on an undirected graph.
"""

from __future__ import annotations

from p2pfl.algorithms.asynchronous import AsyncGossip
from p2pfl.algorithms.base import refuse_momentum


class ADPSGD(AsyncGossip):
    name = "ad-psgd"
    summary = "AD-PSGD (Lian et al. 2018): asynchronous SGD, each gradient then an atomic average with one neighbour"
    training = {"lr": 0.1, "batch_size": 10, "momentum": 0.0}

    @classmethod
    def check(cls, cfg) -> None:
        super().check(cfg)
        refuse_momentum(cls, cfg)

    def local_sgd(self):
        return self.ctx.sgd(steps=1)  # one stochastic gradient a work

    def finished(self, round_index: int, t: float, peer: int) -> float:
        x, start = self.x, t
        j = self.partner(round_index, peer)
        if j is not None:  # a lost message (--drop-links, j away) averages nothing; i moves on after the round trip
            there = t + self.message_time(round_index, peer, j)
            start = there + self.message_time(round_index, j, peer)
            if self.send(peer, j, there) and self.send(j, peer, start):
                mean = (x[peer] + x[j]) / 2
                x[peer], x[j] = mean, mean
        x[peer] += self.changes[peer]
        return start
