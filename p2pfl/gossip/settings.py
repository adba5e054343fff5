"""The codec settings every graph algorithm that gossips its weights shares (D-PSGD, DFedAvg, DFedAvgM,
CHOCO-SGD), named like NTK-DFL's Jacobian codec settings, and the codec they choose."""

from __future__ import annotations

from dataclasses import dataclass

from p2pfl.errors import UserError
from p2pfl.gossip.codecs import QSGD, GossipCodec, RandK, TopK
from p2pfl.settings.fields import bits, fraction, option


@dataclass(frozen=True)
class GossipSettings:
    """Compressed gossip's settings (top-k, random-k, quantization): subclass them in an algorithm's
    Settings to give it the --gossip-* flags, and gossip_codec(settings) builds the codec they choose."""

    gossip_topk: float = option(
        1.0,
        "send only the largest-magnitude fraction P of the weights (int32 indices and values); neighbours average "
        "what they heard, keeping their own values elsewhere; 1: all",
        fraction,
    )
    gossip_randk: float = option(
        1.0,
        "send a random fraction P of the weights, drawn from a key keyed by seed, round and sender (the message "
        "carries the 8-byte key and the values); 1: all",
        fraction,
    )
    gossip_quant_bits: int = option(
        0,
        "send every weight as a stochastic QSGD level of N bits (2^N - 1 levels), a sign bit and the row's norm; "
        "0: off",
        bits,
    )


def gossip_codec(settings: GossipSettings) -> GossipCodec | None:
    """The codec the settings choose (None: dense weights, the exchange as without a codec), or one
    UserError line where more than one is asked for."""
    chosen = [
        codec
        for codec, on in (
            (TopK(settings.gossip_topk), settings.gossip_topk < 1),
            (RandK(settings.gossip_randk), settings.gossip_randk < 1),
            (QSGD(settings.gossip_quant_bits), settings.gossip_quant_bits > 0),
        )
        if on
    ]
    if len(chosen) > 1:
        raise UserError(
            f"{' and '.join(c.name for c in chosen)} are two codecs of one message; give one of --gossip-topk, "
            "--gossip-randk and --gossip-quant-bits"
        )
    return chosen[0] if chosen else None
