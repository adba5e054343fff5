"""The codec settings every graph algorithm that gossips its weights shares (D-PSGD, DFedAvg, DFedAvgM,
CHOCO-SGD), derived from the codecs' declarations (p2pfl.gossip.codecs.CODECS): one flag a registered
codec, and --gossip-codec for a codec of one's own; and the codec they choose."""

from __future__ import annotations

import dataclasses
from functools import partial

from p2pfl.errors import UserError
from p2pfl.gossip.codecs import CODECS, GossipCodec
from p2pfl.plugins import call_plugin, is_reference, load_object
from p2pfl.settings.fields import flag, option

OWN = "gossip_codec"  # the setting that names a codec of one's own


def _own_codec_check(value) -> str | None:
    if value is None or is_reference(value):
        return None
    return f"takes a codec of your own as package.module:name (built-in codecs have their flags), got {value!r}"


def _fields() -> list[tuple]:
    own = option(
        None,
        "a codec of your own as package.module:name: a GossipCodec subclass (made with no arguments) or a "
        "function that returns a GossipCodec; none: dense, unless a codec's own flag chooses it",
        _own_codec_check,
    )
    declared = [
        (c.setting.name, c.setting.type, option(c.setting.off, c.setting.help, c.setting.check))
        for c in CODECS.values()
    ]
    return [*declared, (OWN, "str | None", own)]


GossipSettings = dataclasses.make_dataclass("GossipSettings", _fields(), frozen=True)
GossipSettings.__module__ = __name__
GossipSettings.__doc__ = (
    "Compressed gossip's settings, one a registered codec (p2pfl.gossip.codecs) and --gossip-codec: subclass "
    "them in an algorithm's Settings to give it the flags, and gossip_codec(settings) builds the codec they "
    "choose."
)


def codec_flags() -> list[str]:
    """Every flag that chooses a codec, in the registry's order."""
    return [flag(c.setting.name) for c in CODECS.values()] + [flag(OWN)]


def gossip_codec(settings) -> GossipCodec | None:
    """The codec the settings choose (None: dense weights, the exchange as without a codec), or one
    UserError line where more than one is asked for or a codec of one's own is not one."""
    chosen = [
        (c.name, partial(c, getattr(settings, c.setting.name)))
        for c in CODECS.values()
        if getattr(settings, c.setting.name) != c.setting.off
    ]
    own = getattr(settings, OWN, None)
    if own is not None:
        chosen.append((own, partial(load_codec, own)))
    if len(chosen) > 1:
        flags = codec_flags()
        raise UserError(
            f"{' and '.join(name for name, _ in chosen)} are two codecs of one message; give one of "
            f"{', '.join(flags[:-1])} and {flags[-1]}"
        )
    return chosen[0][1]() if chosen else None


def load_codec(reference: str) -> GossipCodec:
    """A codec of one's own by package.module:name, checked where it enters: a GossipCodec subclass (made
    with no arguments) or a function returning a GossipCodec instance."""
    what = f"--gossip-codec {reference}"
    target = load_object(reference, "--gossip-codec")
    if isinstance(target, type) and not issubclass(target, GossipCodec):
        raise UserError(f"{what}: {target.__name__} is a class but not a p2pfl.GossipCodec subclass")
    if not callable(target):
        raise UserError(f"{what}: names a {type(target).__name__}, not a GossipCodec class or a function")
    codec = call_plugin(what, target)
    if not isinstance(codec, GossipCodec):
        raise UserError(f"{what}: returned a {type(codec).__name__}, not a p2pfl.GossipCodec")
    return codec
