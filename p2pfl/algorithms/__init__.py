"""The algorithms by name. Each class declares its name, summary, settings and training defaults, and is
registered when it is defined (p2pfl.algorithms.base); the built-in ones are the modules of graph/ and
star/, imported here. The CLI, the TOML keys and the README's tables are derived from the declarations."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil

from p2pfl.algorithms import graph, star
from p2pfl.algorithms.base import REGISTRY, Algorithm
from p2pfl.errors import UserError
from p2pfl.plugins import is_reference, load_entry_points, load_object

for _family in (graph, star):
    for _module in pkgutil.iter_modules(_family.__path__):
        importlib.import_module(f"{_family.__name__}.{_module.name}")
load_entry_points()


def lookup(algo: str) -> type[Algorithm]:
    """The algorithm of a name: a registered one, or a 'package.module:Class' reference (imported; the
    class registers itself under its own name)."""
    if algo in REGISTRY:
        return REGISTRY[algo]
    if is_reference(algo):
        cls = load_object(algo, "--algo")
        if not (isinstance(cls, type) and issubclass(cls, Algorithm) and cls.__dict__.get("name")):
            raise UserError(f"--algo {algo} is not an algorithm: a subclass of p2pfl.Algorithm with a name of its own")
        return cls
    raise UserError(
        f"unknown algorithm {algo!r}; choose one of: {', '.join(REGISTRY)}, or name your own as package.module:Class"
    )


def setting_names(algo: str) -> list[str]:
    return [f.name for f in dataclasses.fields(lookup(algo).Settings)]


def owners_of(name: str) -> list[str]:
    """The algorithms that have a setting of this name."""
    return [algo for algo in REGISTRY if name in setting_names(algo)]


__all__ = ["REGISTRY", "Algorithm", "lookup", "owners_of", "setting_names"]
