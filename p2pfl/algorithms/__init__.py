"""The algorithms by name. Each class declares its name, summary, settings and training defaults, and is
registered when it is defined (p2pfl.algorithms.base); the built-in ones are the modules of graph/ and
star/, imported here. The CLI, the TOML keys and the README's tables are derived from the declarations."""
from __future__ import annotations

import dataclasses
import importlib
import pkgutil

from p2pfl.algorithms import graph, star
from p2pfl.algorithms.base import REGISTRY, Algorithm

for _family in (graph, star):
    for _module in pkgutil.iter_modules(_family.__path__):
        importlib.import_module(f"{_family.__name__}.{_module.name}")


def setting_names(algo: str) -> list[str]:
    return [f.name for f in dataclasses.fields(REGISTRY[algo].Settings)]


def owners_of(name: str) -> list[str]:
    """The algorithms that have a setting of this name."""
    return [algo for algo in REGISTRY if name in setting_names(algo)]


__all__ = ["REGISTRY", "Algorithm", "owners_of", "setting_names"]
