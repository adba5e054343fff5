"""Settings declared as dataclass fields: each is an option with a default, a help sentence and a check.
The run's settings (p2pfl.settings.run_config) and each algorithm's are declared this way; the CLI flags, the
TOML keys, the checks and the README's tables are derived from the declarations, so a default is
written once, next to what it sets."""

from __future__ import annotations

import argparse
import dataclasses
import math
from typing import Any, Callable

from p2pfl.errors import UserError

Check = Callable[[Any], "str | None"]  # returns an error sentence or None


def option(
    default: Any,
    help: str,
    check: Check | None = None,
    choices: tuple[str, ...] = (),
    *,
    shown: str | None = None,
    noun: str | None = None,
    wanted: str | None = None,
) -> Any:
    """A settings field: its default, its help text and how to check a value. shown: how --help states a
    default that is not a plain value (None: worked out later); noun: names a choice in the error for an
    unknown one; wanted: what a value that cannot be parsed should look like."""
    metadata = {"help": help, "check": check, "choices": choices, "shown": shown, "noun": noun, "wanted": wanted}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def default_of(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def positive(v) -> str | None:
    """A check for option(): the value is above 0 (None when it passes, else what is wrong)."""
    return None if v > 0 else f"must be positive, got {v}"


def non_negative(v) -> str | None:
    """A check for option(): the value is 0 or above."""
    return None if v >= 0 else f"must be non-negative, got {v}"


def fraction(v) -> str | None:
    """A check for option(): the value is in (0, 1]."""
    return None if 0 < v <= 1 else f"must be in (0, 1], got {v}"


def positive_ints(v) -> str | None:
    return None if v and all(int(x) >= 1 for x in v) else f"needs positive integers, got {list(v)}"


def bits(v) -> str | None:
    return None if 0 <= v <= 8 else f"must be between 0 (off) and 8, got {v}"


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def at_least(low: float) -> Check:
    """A check for option(): the value is low or above."""

    def test(v) -> str | None:
        return None if v >= low else f"must be at least {low:g}, got {v}"

    return test


def probability(v) -> str | None:
    """A check for option(): the value is in [0, 1)."""
    return None if 0 <= v < 1 else f"is a probability in [0, 1), got {v}"


def positive_or_auto(v) -> str | None:
    return None if v == "auto" or v > 0 else f"must be positive or auto, got {v}"


def kind_of(f: dataclasses.Field) -> str:
    """bool, int, float, str, ints (a tuple of ints) or float|auto (a number, or the word auto: the
    algorithm works it out), from the field's annotation."""
    text = (f.type.__name__ if isinstance(f.type, type) else str(f.type)).replace(" | None", "")
    if text == "float | str":
        return "float|auto"
    for kind in ("bool", "int", "float", "str"):
        if text == kind:
            return kind
    if text.startswith(("tuple", "list")):
        return "ints"
    raise TypeError(f"settings field {f.name} has an unsupported type {text}")


def coerce(f: dataclasses.Field, value: Any, strict: bool = True) -> Any:
    """A value turned into the field's type, or one UserError line. strict (TOML values, parsed flags):
    only a value of the right type, or an int for a float, is taken; not strict (a flag's text): strings
    are parsed."""
    kind, where = kind_of(f), flag(f.name)
    try:
        if strict and kind != "str" and isinstance(value, str) and not (kind == "float|auto" and value == "auto"):
            raise ValueError
        if kind == "bool":
            if isinstance(value, bool):
                return value
            raise ValueError
        if kind == "ints":
            items = value if isinstance(value, (list, tuple)) else str(value).replace(" ", "").split(",")
            return tuple(_integer(v, strict) for v in items if v != "")
        if kind == "int":
            return _integer(value, strict)
        if kind == "float|auto" and value == "auto":
            return value
        if kind in ("float", "float|auto"):
            if isinstance(value, bool):
                raise ValueError
            number = float(value)
            if not math.isfinite(number):
                raise ValueError
            return number
        if not isinstance(value, str):
            raise ValueError
        return value
    except (TypeError, ValueError):
        wanted = (
            f.metadata.get("wanted")
            or {
                "bool": "true or false",
                "ints": "comma-separated integers",
                "int": "an integer",
                "float": "a finite number",
                "float|auto": "a finite number or auto",
                "str": "a name",
            }[kind]
        )
        if strict and isinstance(value, str) and kind != "str" and _parses(f, value):
            raise UserError(f"{where} takes {wanted}, not the string {value!r}: in a TOML file write it without quotes")
        raise UserError(f"{where} takes {wanted}, not {value!r}")


def _parses(f: dataclasses.Field, text: str) -> bool:
    """Whether a flag's text would give the field a value (a TOML string that should have been a number)."""
    if kind_of(f) == "bool":
        return text.lower() in ("true", "false")
    try:
        coerce(f, text, strict=False)
        return True
    except UserError:
        return False


def _integer(value: Any, strict: bool) -> int:
    """An int; strict (a TOML value): 4.0 is no integer (a count of bits or peers written as a float is
    likely a setting mistaken for another)."""
    if isinstance(value, bool) or (isinstance(value, float) and (strict or not value.is_integer())):
        raise ValueError
    return int(value)


def check(f: dataclasses.Field, value: Any) -> None:
    choices, test = f.metadata.get("choices"), f.metadata.get("check")
    if choices and value not in choices:
        if f.metadata.get("noun"):
            raise UserError(f"unknown {f.metadata['noun']} {value!r}; choose one of: {', '.join(choices)}")
        raise UserError(f"{flag(f.name)} must be one of {', '.join(choices)}, got {value!r}")
    problem = test(value) if test else None
    if problem:
        raise UserError(f"{flag(f.name)} {problem}")


def build(cls: type, values: dict[str, Any], defaults: dict[str, Any] | None = None):
    """An instance of settings class cls from values (TOML, or flags already parsed by add_flags), each
    type-checked and range-checked; defaults are the algorithm's own overrides of the class defaults."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    merged = {**(defaults or {}), **values}
    out = {}
    for name, value in merged.items():
        out[name] = coerce(fields[name], value)
        check(fields[name], out[name])
    return cls(**out)


def defaults_of(cls: type, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    return {f.name: (overrides or {}).get(f.name, default_of(f)) for f in dataclasses.fields(cls)}


def declared(cls: type) -> list[dataclasses.Field]:
    """The fields of cls that are declared options (a run's config also holds derived state)."""
    return [f for f in dataclasses.fields(cls) if "help" in f.metadata]


def written(value: Any) -> str:
    """A value as a flag takes it: lists comma-separated, booleans lower case."""
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value))
    return str(value).lower() if isinstance(value, bool) else str(value)


def shown_default(f: dataclasses.Field, overrides: dict[str, Any] | None = None) -> str:
    """A field's default as --help and the docs state it."""
    if f.metadata.get("shown") and f.name not in (overrides or {}):
        return f.metadata["shown"]
    return written((overrides or {}).get(f.name, default_of(f)))


def add_flags(
    group: argparse._ArgumentGroup,
    cls: type,
    overrides: dict[str, Any] | None = None,
    extra: dict[str, str] | None = None,
) -> None:
    """One flag per declared field, its text parsed into the field's type; extra: sentences added to some
    fields' help (the names a choice may take, where they are known above this layer)."""
    for f in declared(cls):
        more = f" {extra[f.name]}" if extra and f.name in extra else ""
        text = f"{f.metadata['help']}{more} (default {shown_default(f, overrides)})"
        if kind_of(f) == "bool":  # --x turns it on, --no-x off
            group.add_argument(flag(f.name), dest=f.name, action=argparse.BooleanOptionalAction, help=text)
        else:
            group.add_argument(
                flag(f.name),
                dest=f.name,
                help=text,
                metavar=metavar(f),
                type=lambda value, f=f: coerce(f, value, strict=False),
            )


def metavar(f: dataclasses.Field) -> str:
    """What a flag's value looks like in --help: N a count, P a probability or fraction, X another number;
    a name's own word (--data-dir DIR)."""
    kind, check = kind_of(f), f.metadata.get("check")
    if kind == "int":
        return "N"
    if kind == "ints":
        return "N[,N...]"
    if kind in ("float", "float|auto"):
        word = "P" if check in (probability, fraction) else "X"
        return word + ("|auto" if kind == "float|auto" else "")
    return f.name.upper().split("_")[-1]
