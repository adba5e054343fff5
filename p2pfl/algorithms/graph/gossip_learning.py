"""Gossip learning (Ormándi, Hegedűs and Jelasity 2013), on the virtual clock: each peer, at its own speed,
repeatedly trains its model on its own data (its local epochs), then pushes the model to one neighbour
drawn at random; a model that arrives is merged into the receiver's at once, x_j <- (x_j + x_i) / 2, and
the receiver's training under way adds its change to the merged model when it is done. A pushed model
arrives after the link's latency plus its bytes over the link's bandwidth (p2pfl.comm.clock); nothing
waits for it. On a directed graph a peer pushes to its out-neighbours.

Compared with gossipy (makgyver/gossipy: node.py's GossipNode, model/handler.py's TorchModelHandler, with
its default merge-update mode): the same push of the whole model to one random peer and the same plain
average on arrival; gossipy sends on a timer (every delta ticks) and trains on each model it receives
(merge, then its local epochs, at no cost in time), where a peer here trains continuously at its step time
and pushes each time its work is done, so that the clock, not the message count, sets how much it trains.
"""

from __future__ import annotations

import heapq
import math

import torch

from p2pfl.algorithms.asynchronous import ARRIVAL, AsyncGossip


class GossipLearning(AsyncGossip):
    name = "gossip-learning"
    summary = "gossip learning (Ormándi et al. 2013): train, push the model to a random neighbour, merge arrivals"
    training = {"lr": 0.1, "batch_size": 10, "local_epochs": 1, "momentum": 0.0}
    directed_graphs = True  # a push goes to an out-neighbour
    state = {**AsyncGossip.state, "in_flight": "pooled"}

    def finished(self, round_index: int, t: float, peer: int) -> float:
        x = self.x
        x[peer] += self.changes[peer]
        j = self.partner(round_index, peer)
        arrival = t + self.message_time(round_index, peer, j) if j is not None else math.inf
        if j is not None and self.send(peer, j, arrival):  # lost (--drop-links), or j away when it arrives
            self.mail[(arrival, j, peer)] = x[peer].clone()
            heapq.heappush(self.events, (arrival, ARRIVAL, j, peer))
        return t

    def arrive(self, t: float, dst: int, src: int, weights: torch.Tensor) -> None:
        self.x[dst] = (self.x[dst] + weights) / 2
