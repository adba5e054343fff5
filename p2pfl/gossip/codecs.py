"""What crosses an edge when peers gossip their weights. A codec encodes a peer's row once a round (each
neighbour gets the same message) and a neighbour decodes it; a message's bytes are the tensors it holds
(values, indices or the key that draws them, scales, bit-packed levels), as a wire would carry them.

D-PSGD, DFedAvg and CHOCO-SGD encode the difference between a peer's weights and its public copy, which
its neighbours keep and move by what they hear (p2pfl.algorithms.public_copies): what is sent shrinks as
the copies catch up, and a sparse message leaves the rest of the copy as it was. neighbour_average's codec
encodes the weights themselves, for an algorithm of one's own on a graph that changes.

Each codec is declared once, here, as a class: its name, the setting that turns it on (its flag, default,
check and help), what its message holds and weighs (the docs' table) and CHOCO-SGD's consensus step with
it. A class that declares a setting is registered (CODECS) when it is defined; the gossip flags, the
refusal of two codecs at once, --help, the docs' table and CHOCO's default gamma are derived from the
registry (p2pfl.gossip.codec_settings). A user's codec needs no flag: --gossip-codec package.module:name."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from p2pfl.gossip.bitpack import pack_mask_rows, pack_rows, unpack_mask_rows, unpack_rows
from p2pfl.comm import Payload
from p2pfl.errors import UserError
from p2pfl.seeding import derive_seed, torch_generator
from p2pfl.settings.fields import bits, fraction


@dataclass
class Compressed(Payload):
    """An encoded row: the codec's tensors, in its order."""

    parts: tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class CodecSetting:
    """The setting that turns a codec on: its name (the flag --name-with-dashes, the TOML key), its type,
    the value that leaves the codec off (the default), its check and its help sentence."""

    name: str
    type: str
    off: Any
    check: Callable[[Any], str | None]
    help: str


CODECS: dict[str, type[GossipCodec]] = {}  # by name, the built-in codecs that declare a setting


class GossipCodec:
    """The identity: the whole row, float32 as the model holds it.

    A codec of one's own subclasses this: name, encode_rows (or encode) and decode, and contraction where
    it is biased; choco_gamma is CHOCO-SGD's consensus step with it (None: --choco-gamma must be given).
    A subclass that declares `setting` is registered and gets its flag (built-in codecs)."""

    name = "dense"
    setting: CodecSetting | None = None  # the flag that turns it on; None: chosen by --gossip-codec only
    message = "the whole row, float32"  # what a message holds, for the docs' table
    wire_bytes = "4 D"  # a message's bytes for D weights, for the docs' table
    choco_gamma: float | None = 1.0  # CHOCO-SGD's consensus step with this codec (dense: exact averaging)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "setting" in cls.__dict__ and cls.setting is not None:
            if cls.name in CODECS:
                raise ValueError(f"two gossip codecs are named {cls.name!r}")
            CODECS[cls.name] = cls

    def encode(self, x: torch.Tensor, seed: int, round_index: int, peer: int) -> Compressed:
        return Compressed((x,))

    def encode_rows(self, rows: torch.Tensor, seed: int, round_index: int, peers: list[int]) -> list[Compressed]:
        """Each row's message (rows[i] is peers[i]'s), as encode would give it one by one."""
        return [self.encode(x, seed, round_index, p) for x, p in zip(rows, peers)]

    def decode(self, message: Compressed, size: int) -> tuple[torch.Tensor | None, torch.Tensor]:
        """(the coordinates sent, or None for all of them; their values)."""
        return None, message.parts[0]

    def decode_rows(self, messages: list[Compressed], size: int) -> list[tuple[torch.Tensor | None, torch.Tensor]]:
        """Each message decoded, as decode would one by one (a codec may decode many at once)."""
        return [self.decode(message, size) for message in messages]

    def contraction(self, size: int) -> float:
        """The factor that makes the codec a contraction, E|Q(x) - x|^2 <= (1 - delta)|x|^2, as CHOCO-SGD's
        analysis needs (1 for the sparsifiers; QSGD's 1/tau)."""
        return 1.0


class TopK(GossipCodec):
    """The largest-magnitude fraction of the coordinates: int32 indices and their values."""

    name = "top-k"
    setting = CodecSetting(
        "gossip_topk",
        "float",
        1.0,
        fraction,
        "send only the largest-magnitude fraction P of the change since the peer's public copy (int32 indices "
        "and values; dpsgd, dfedavg and choco need a static graph for the copies); 1: all",
    )
    message = "the ceil(P D) largest-magnitude coordinates of the change: int32 indices and float32 values"
    wire_bytes = "8 ceil(P D)"
    choco_gamma = 0.04  # CHOCO-SGD's experiments (ICML 2019): a ring of 9, 1% of 2,000 coordinates

    def __init__(self, keep: float):
        self.keep = keep

    def encode(self, x, seed, round_index, peer):
        return self.encode_rows(x[None], seed, round_index, [peer])[0]

    def encode_rows(self, rows, seed, round_index, peers):
        """One top-k over all rows at once (a call a row cost more than the selection at 300 peers)."""
        k = max(1, math.ceil(self.keep * rows.shape[1]))
        index = rows.abs().topk(k, dim=1, sorted=False).indices.sort(dim=1).values
        values = rows.gather(1, index)
        index = index.to(torch.int32)
        return [Compressed((i, v)) for i, v in zip(index, values)]

    def decode(self, message, size):
        index, values = message.parts
        return index.long(), values


class RandK(GossipCodec):
    """A random fraction of the coordinates, drawn from a key keyed by (seed, round, sender): the message
    carries the key (8 bytes) and the values, and every receiver draws the same coordinates on any
    layout of peers over ranks."""

    name = "random-k"
    setting = CodecSetting(
        "gossip_randk",
        "float",
        1.0,
        fraction,
        "send a random fraction P of the change since the peer's public copy, drawn from a key keyed by seed, "
        "round and sender (the message carries the 8-byte key and the values); 1: all",
    )
    message = (
        "ceil(P D) weights at coordinates drawn from a key of (seed, round, sender): the 8-byte key and the "
        "values; every receiver, on any layout, draws the same coordinates"
    )
    wire_bytes = "8 + 4 ceil(P D)"
    choco_gamma = 0.01  # CHOCO-SGD's experiments: random 1% of 2,000 coordinates

    def __init__(self, keep: float):
        self.keep = keep

    def encode(self, x, seed, round_index, peer):
        key = derive_seed(seed, "gossip-randk", round_index, peer)
        index = self._coordinates(key, x.numel()).to(x.device)
        return Compressed((torch.tensor([key], dtype=torch.int64, device=x.device), x[index]))

    def decode(self, message, size):
        key, values = message.parts
        return self._coordinates(int(key[0]), size).to(values.device), values

    def _coordinates(self, key: int, size: int) -> torch.Tensor:
        gen = torch.Generator()
        gen.manual_seed(key)
        k = max(1, math.ceil(self.keep * size))
        return torch.randperm(size, generator=gen)[:k].sort().values


class QSGD(GossipCodec):
    """Stochastic quantization (Alistarh et al. 2017): x_i ~ sign(x_i) |x| l_i / s with l_i the level
    floor(s |x_i| / |x| + u), u uniform from the sender's key, so that E[Q(x)] = x. s = 2^bits - 1 levels
    of `bits` bits each, a sign bit and the norm (float32) on the wire."""

    name = "qsgd"
    setting = CodecSetting(
        "gossip_quant_bits",
        "int",
        0,
        bits,
        "send each coordinate of the change since the peer's public copy as a stochastic QSGD level of N bits "
        "(2^N - 1 levels), a sign bit and the change's norm, scaled by 1/tau to a contraction as CHOCO-SGD's; 0: off",
    )
    message = (
        "QSGD (Alistarh et al. 2017) of the change x: each coordinate's stochastic level floor((2^N - 1) "
        "abs(x_i)/norm(x) + u), u uniform from the sender's key, so the decoded change is unbiased (the copies "
        "add it scaled by 1/tau, biased but contracting); N bits a level, a sign bit, the float32 norm"
    )
    wire_bytes = "4 + ceil(N D / 8) + ceil(D / 8)"
    choco_gamma = 0.34  # CHOCO-SGD's experiments: 16-level QSGD of 2,000 coordinates

    def __init__(self, bits: int):
        self.bits, self.levels = bits, 2**bits - 1

    def encode(self, x, seed, round_index, peer):
        return self.encode_rows(x[None], seed, round_index, [peer])[0]

    def encode_rows(self, rows, seed, round_index, peers):
        """Every row at once but its norm and its draws (each row's own, keyed by its peer): a round's 32
        messages cost about what one did row by row."""
        norms = torch.stack([x.norm() for x in rows])
        u = torch.stack(
            [torch.rand(rows.shape[1], generator=torch_generator(seed, "gossip-qsgd", round_index, p)) for p in peers]
        ).to(rows.device)
        scaled = rows.abs().div_(norms.clamp(min=torch.finfo(rows.dtype).tiny)[:, None]).mul_(self.levels)
        level = scaled.add_(u).floor_().clamp_(max=self.levels).to(torch.uint8)  # in place: one buffer, same values
        packed, signs = pack_rows(level, self.bits), pack_mask_rows(rows < 0)
        return [Compressed((n.reshape(1).float(), q, m)) for n, q, m in zip(norms, packed, signs)]

    def decode(self, message, size):
        return self.decode_rows([message], size)[0]

    def decode_rows(self, messages, size):
        norms = torch.cat([m.parts[0] for m in messages])
        level = unpack_rows(torch.stack([m.parts[1] for m in messages]), self.bits, size).float()
        negative = unpack_mask_rows(torch.stack([m.parts[2] for m in messages]), size)
        values = torch.where(negative, -level, level).mul_((norms / self.levels)[:, None])  # a sign is exact
        return [(None, v) for v in values]

    def contraction(self, size):
        """1/tau, tau = 1 + min(d/s^2, sqrt(d)/s): CHOCO-SGD's rescaled (biased) QSGD."""
        return 1.0 / (1 + min(size / self.levels**2, math.sqrt(size) / self.levels))


def decode_checked(codec: GossipCodec, message: Compressed, size: int) -> tuple[torch.Tensor | None, torch.Tensor]:
    """codec.decode, its answer checked (a codec of one's own enters here): (None, size values) or
    (indices, one value each)."""
    return decoded_checked(codec, codec.decode(message, size), size)


def decode_rows_checked(codec: GossipCodec, messages: list[Compressed], size: int) -> list[tuple]:
    """codec.decode_rows, each answer checked as decode_checked checks one."""
    decoded = codec.decode_rows(messages, size)
    if not isinstance(decoded, list) or len(decoded) != len(messages):
        raise UserError(f"the gossip codec {codec.name}'s decode_rows returned no list of one answer a message")
    return [decoded_checked(codec, answer, size) for answer in decoded]


def decoded_checked(codec: GossipCodec, answer, size: int) -> tuple[torch.Tensor | None, torch.Tensor]:
    index, values = answer
    fits = values.shape == (size,) if index is None else index.dim() == 1 and values.shape == index.shape
    if not fits:
        got = f"{'no indices' if index is None else f'indices of shape {tuple(index.shape)}'}"
        raise UserError(
            f"the gossip codec {codec.name} decoded {got} and values of shape {tuple(values.shape)}; decode "
            f"returns (None, {size} values) or (indices, one value each)"
        )
    return index, values


def dense_bytes(x: torch.Tensor) -> int:
    return x.numel() * x.element_size()
