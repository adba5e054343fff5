"""The algorithms by name. Each class declares its name, summary, settings and training defaults; the
CLI, the TOML keys and the README's tables are derived from these declarations."""
from __future__ import annotations

import dataclasses

from p2pfl.algorithms.base import Algorithm
from p2pfl.algorithms.cyclic import Cyclic
from p2pfl.algorithms.dfedavg import DFedAvg, DFedAvgM
from p2pfl.algorithms.dispfl import DisPFL
from p2pfl.algorithms.dpsgd import DPSGD
from p2pfl.algorithms.fedavg import Centralized, DataShare, FedAvg, FedNova, FedProx, Scaffold
from p2pfl.algorithms.fedavg_ft import FedAvgFT
from p2pfl.algorithms.moon import Moon
from p2pfl.algorithms.ntk_dfl import NTKDFL
from p2pfl.algorithms.ntk_fl import CPNTKFL, NTKFL
from p2pfl.algorithms.tct import TCT

REGISTRY: dict[str, type[Algorithm]] = {cls.name: cls for cls in [
    DPSGD, DFedAvg, DFedAvgM, DisPFL, NTKDFL, FedAvg, FedProx, Scaffold, FedNova, Centralized, DataShare, Moon, Cyclic, NTKFL, CPNTKFL, TCT, FedAvgFT]}


def setting_names(algo: str) -> list[str]:
    return [f.name for f in dataclasses.fields(REGISTRY[algo].Settings)]


def owners_of(name: str) -> list[str]:
    """The algorithms that have a setting of this name."""
    return [algo for algo in REGISTRY if name in setting_names(algo)]


__all__ = ["REGISTRY", "owners_of", "setting_names"]
