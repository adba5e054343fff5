"""Public copies for compressed gossip (CHOCO-SGD's memory-efficient form, Koloskova et al. 2019, and
D-PSGD and DFedAvg with a codec, which send the change since their last message as the field's
implementations do rather than compressing the weights themselves): each peer i keeps x_hat_i, the copy of its weights that its
neighbours track, and s_i = sum_j W_ij x_hat_j over its neighbourhood. A peer sends only the compressed
difference q_i = Q(target_i - x_hat_i) (scaled to a contraction, QSGD's 1/tau), and every copy moves by what
was sent: x_hat_j <- x_hat_j + q_j, s_i <- s_i + sum_j W_ij q_j. Two rows a peer, whatever its degree.

Compared with decentralizepy (sharing/PartialModel.py, its TopK): it picks coordinates by their change
since the last exchange too, but sends their current values and lets a receiver keep its own values
elsewhere, with no copies and on any graph. The sums here run over one fixed set of neighbours: the
graph is static. Under --drop-links a lost q_j is not
resent and the receiver's s_i stays off by W_ij q_j; an offline peer neither sends nor hears.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from p2pfl.algorithms.base import Algorithm, neighbour_average
from p2pfl.errors import UserError
from p2pfl.gossip.codec_settings import GossipSettings, gossip_codec
from p2pfl.gossip.codecs import Compressed, GossipCodec, decode_rows_checked, dense_bytes
from p2pfl.models import initial_parameters
from p2pfl.settings.fields import option, positive
from p2pfl.measure.graph_diagnostics import graph_gap, mixing_matrix
from p2pfl.threats.privacy import exposure
from topologies import in_neighbours, mixing_weights


class PublicCopies:
    """x_hat (estimate) and s (mixed) for this rank's peers, one row each, moved by compressed differences."""

    def __init__(self, ctx, codec: GossipCodec, estimate: torch.Tensor, mixed: torch.Tensor):
        self.ctx, self.codec = ctx, codec
        self.estimate = estimate  # x_hat_i, the public copy of each peer's weights
        self.mixed = mixed  # s_i = sum_j W_ij x_hat_j

    def send(self, round_index: int, target: torch.Tensor) -> list[int]:
        """Each online peer sends Q(target_i - x_hat_i) to its out-neighbours; every copy it reaches moves by
        it. Returns the rows of the peers that took part."""
        ctx, codec = self.ctx, self.codec
        online = ctx.online_rows(round_index)
        peers = [ctx.peers[i] for i in online]
        rows = slice(None) if len(online) == len(ctx.peers) else online  # a slice copies nothing
        messages = codec.encode_rows(target[rows] - self.estimate[rows], ctx.cfg.seed, round_index, peers)
        sends = {p: (message, dense_bytes(target[0])) for p, message in zip(peers, messages)}
        inbox = ctx.neighbour_exchange("gossip", round_index, Compressed, sends, receivers=set(peers))
        weights = mixing_weights(ctx.schedule.graph(round_index), ctx.cfg.mixing, ctx.sample_counts)
        heard = {ctx.peers[i]: {ctx.peers[i]: sends[ctx.peers[i]][0], **inbox[ctx.peers[i]]} for i in online}
        senders = {j: heard[p][j] for p in heard for j, _ in weights[p] if j in heard[p]}
        decoded = self._differences(senders)  # each sender's q decoded once, all in one call
        for i in online:
            p = ctx.peers[i]
            for j, w in weights[p]:  # in peer order, so every layout adds alike
                if j in heard[p]:
                    index, q = decoded[j]
                    if j == p:
                        _add(self.estimate[i], index, q)
                    _add(self.mixed[i], index, w * q)
        return online

    def _differences(self, messages: dict[int, Compressed]) -> dict[int, tuple[torch.Tensor | None, torch.Tensor]]:
        """Each sender's q_j as the codec decodes it, scaled to a contraction (QSGD's 1/tau, as CHOCO-SGD's)."""
        size, order = self.ctx.flat.shape[1], sorted(messages)
        scale = self.codec.contraction(size)
        answers = decode_rows_checked(self.codec, [messages[j] for j in order], size) if order else []
        return {j: (index, values * scale if scale != 1.0 else values) for j, (index, values) in zip(order, answers)}


def _add(row: torch.Tensor, index: torch.Tensor | None, values: torch.Tensor) -> None:
    if index is None:
        row += values
    else:
        row[index] += values


def starting_copies(ctx, codec: GossipCodec) -> PublicCopies:
    """Copies that start at the peers' initial weights, which every peer can draw from the run's seed
    (--init: one shared model, or one keyed by each peer): x_hat_i = x_i and s_i = sum_j W_ij x_j at round 0,
    with no message sent. CHOCO-SGD starts its copies at 0 instead, as its paper."""
    graph = ctx.schedule.graph(0)
    weights = mixing_weights(graph, ctx.cfg.mixing, ctx.sample_counts)
    hood = sorted({j for p in ctx.peers for j, _ in weights[p]})
    drawn = hood[:1] if ctx.cfg.init == "same" else hood  # one shared model is drawn once
    rows = initial_parameters(ctx.stack.model, drawn, ctx.cfg.seed, ctx.cfg.init, ctx.device)
    start = {j: rows[0 if ctx.cfg.init == "same" else k] for k, j in enumerate(hood)}
    mixed = torch.stack([sum(w * start[j] for j, w in weights[p]) for p in ctx.peers])
    return PublicCopies(ctx, codec, ctx.flat.clone(), mixed)


def average_over_copies(ctx, round_index: int, flat: torch.Tensor, copies: PublicCopies) -> torch.Tensor:
    """D-PSGD's averaging x_i <- sum_j W_ij x_j with the neighbours' public copies for x_j: each peer first
    sends the compressed change of its weights since its copy (x_hat_i moves toward x_i), then takes
    s_i + W_ii (x_i - x_hat_i), its own weights exact. Offline peers keep theirs."""
    online = copies.send(round_index, flat)
    weights = mixing_weights(ctx.schedule.graph(round_index), ctx.cfg.mixing, ctx.sample_counts)
    own = torch.tensor([dict(weights[ctx.peers[i]])[ctx.peers[i]] for i in online], dtype=flat.dtype)
    own = own.to(flat.device)[:, None]
    if len(online) == len(flat):  # every peer online: in place, no copies of the rows picked
        return (flat - copies.estimate).mul_(own).add_(copies.mixed)
    out = flat.clone()
    out[online] = copies.mixed[online] + own * (flat[online] - copies.estimate[online])
    return out


@dataclass(frozen=True)
class AveragerSettings(GossipSettings):
    gossip_steps: int = option(
        1,
        "gossip steps a round: a peer averages with its neighbours this many times, a message each (under "
        "--dp-clip, Muffliato's K, Cyffers et al. 2022: more steps spread each noise over more peers)",
        positive,
    )


class GossipAverager(Algorithm):
    """What D-PSGD and DFedAvg share: averaging with the neighbours, dense (--gossip-steps times a round),
    or over public copies moved by a codec's compressed changes (--gossip-topk, --gossip-randk,
    --gossip-quant-bits), which need a static graph. A subclass names itself and writes its round around
    self.average."""

    directed_graphs = True  # averaging reads in-neighbours only
    withstands_threats = True  # dense averaging goes through neighbour_average, where the threats act
    Settings = AveragerSettings

    @classmethod
    def check(cls, cfg) -> None:
        codec = gossip_codec(cfg.settings) is not None
        if codec and (cfg.byzantine or cfg.robust_aggregation != "none"):
            raise UserError(
                f"--algo {cls.name}: Byzantine peers and robust rules act on dense gossip; a codec sends changes "
                "to public copies, which they do not model: drop the codec or --byzantine/--robust-aggregation"
            )
        if codec and cfg.settings.gossip_steps != 1:
            raise UserError(
                f"--algo {cls.name}: --gossip-steps repeats dense averaging; a codec's copies move once a round"
            )

    @classmethod
    def needs_static_graph(cls, settings) -> bool:
        return gossip_codec(settings) is not None  # the public copies sum one set of neighbours

    def __init__(self, ctx, settings=None):
        super().__init__(ctx, settings)
        codec = gossip_codec(self.settings)  # built once; None: dense
        self.copies = starting_copies(ctx, codec) if codec is not None else None

    @property
    def state(self) -> dict[str, str]:
        return {"copies.estimate": "peer", "copies.mixed": "peer"} if self.copies is not None else {}

    @property
    def gossip_steps(self) -> int:
        """Dense averagings a round (--gossip-steps)."""
        return self.settings.gossip_steps

    def average(self, round_index: int) -> None:
        """ctx.flat averaged with the neighbours: dense (--gossip-steps times), or over their public copies
        with a codec."""
        ctx = self.ctx
        if self.copies is not None:
            ctx.flat = average_over_copies(ctx, round_index, ctx.flat, self.copies)
            return
        for step in range(self.gossip_steps):
            phase = "average" if step == 0 else f"average-{step + 1}"
            ctx.flat = neighbour_average(ctx, round_index, ctx.flat, phase)

    def spreading_steps(self) -> int | None:
        """ceil(ln n / gap): the plain gossip steps that shrink the peers' spread by a factor of n (the
        paper's accelerated gossip takes ln n / sqrt(gap)), the gap the run's summary states of its one
        graph; None where W does not keep the mean (no gap)."""
        ctx = self.ctx
        gap = graph_gap(ctx.schedule.graph(0), ctx.cfg.mixing, ctx.sample_counts)
        return None if gap is None else max(1, math.ceil(math.log(ctx.cfg.peers) / max(gap, 1e-12)))

    def _uncounted(self) -> str | None:
        """Why the run's network epsilon is not stated (None: it is)."""
        ctx = self.ctx
        if self.gossip_steps == 1:
            return "one gossip step a round: most of what a peer hears of another comes in later rounds"
        if ctx.schedule.varies or ctx.faults is not None or ctx.threats is not None or self.copies is not None:
            return "the count models plain averaging on one graph, without faults, threats or a codec"
        return None

    def network_exposure(self) -> np.ndarray | None:
        """Muffliato's S[u, v] over the run's K gossip steps (p2pfl.threats.privacy): each noised step
        counted over the K steps of plain averaging after it, on the run's one graph; None where that is not
        what runs (_uncounted)."""
        if self._uncounted() is not None:
            return None
        graph = self.ctx.schedule.graph(0)
        heard = [in_neighbours(graph, v) for v in range(self.ctx.cfg.peers)]
        return exposure(mixing_matrix(graph, self.ctx.cfg.mixing, self.ctx.sample_counts), self.gossip_steps, heard)

    def notes(self) -> list[str]:
        """Under --dp-clip with more than one gossip step: whether dp_epsilon_network is stated, and whether
        K steps spread a noise over the graph (the count assumes it)."""
        ctx, steps = self.ctx, self.gossip_steps
        if steps == 1 or not ctx.cfg.dp_clip:
            return []
        why = self._uncounted()
        if why is not None:
            return [f"{steps} gossip steps a round; no dp_epsilon_network: {why}"]
        note = f"{steps} gossip steps a round; dp_epsilon_network counts each noised step over them"
        enough = self.spreading_steps()
        if enough is not None and steps < enough:
            note += f"; fewer than ln(n) / gap = {enough}, so later rounds carry more of a noise than the count sees"
        return [note]
