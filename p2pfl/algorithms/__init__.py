"""The algorithms by name, with their defaults and their own settings.

The table is plain data so the CLI can list names and defaults without importing an algorithm's
module; an algorithm's code is imported only when a run asks for it.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

from p2pfl.errors import UserError


@dataclass(frozen=True)
class Option:
    """An algorithm-specific setting: a CLI flag and a TOML key (stored in RunConfig.extras)."""

    name: str
    help: str
    type: Callable[[str], Any] | None = None
    check: Callable[[Any], str | None] | None = None  # returns an error sentence or None
    flag_action: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"dest": self.name, "help": self.help}
        if self.flag_action:
            kw["action"] = self.flag_action
        else:
            kw["type"] = self.type
        return kw


def int_list(text: str) -> list[int]:
    try:
        return [int(v) for v in str(text).replace(" ", "").split(",") if v]
    except ValueError:
        raise UserError(f"expected comma-separated integers, got {text!r}")


def _positive(value: Any) -> str | None:
    return None if value > 0 else f"must be positive, got {value}"


def _non_negative(value: Any) -> str | None:
    return None if value >= 0 else f"must be non-negative, got {value}"


def _one_of(*options: str) -> Callable[[Any], str | None]:
    return lambda v: None if v in options else f"must be one of {', '.join(options)}, got {v!r}"


def _positive_ints(values: Any) -> str | None:
    if not values or any(int(v) < 1 for v in values):
        return f"needs positive integers, got {values}"
    return None


def _fraction(value: Any) -> str | None:
    return None if 0 < value <= 1 else f"must be in (0, 1], got {value}"


def _bits(value: Any) -> str | None:
    return None if 0 <= value <= 8 else f"must be between 0 (off) and 8, got {value}"


OPTIONS = {o.name: o for o in [
    Option("ntk_taus", "candidate evolution steps t, comma-separated (default 100,200,...,800)", int_list,
           _positive_ints),
    Option("ntk_loss", "kernel evolution: ce (ODE, reference code) or mse (closed form, paper eqs. 4-5)", str,
           _one_of("ce", "mse")),
    Option("ntk_ode", "CE evolution: euler (unit steps = gradient descent on the linearized model), deflated "
           "(the same steps, faster: the kernel's top subspace every step, the rest extrapolated) or adaptive "
           "(accurate ODE solution, as the reference code's solver)", str,
           _one_of("deflated", "euler", "adaptive")),
    Option("ntk_selection", "pick t by: network (true loss on neighbourhood data), linearized (loss of "
           "the evolved outputs) or own (true loss on the peer's own data)", str,
           _one_of("network", "linearized", "own")),
    Option("ntk_jacobian", "Jacobian path: auto, factored (exact, fast, MLPs) or dense (any model; "
           "needed by compression)", str, _one_of("auto", "factored", "dense")),
    Option("ntk_batches", "Jacobian batching m1: evolve m1 times a round, each on 1/m1 of the samples", int,
           _positive),
    Option("ntk_subsample", "data subsampling m2: peers use 1/m2 of their samples each round", int,
           _positive),
    Option("ntk_topk", "Jacobian compression: keep this fraction of entries (top-k by magnitude)", float,
           _fraction),
    Option("ntk_quant_bits", "Jacobian compression: quantize kept entries to this many bits (0 = off)", int,
           _bits),
    Option("ntk_projection", "project inputs to this many dims with a shared-seed Gaussian matrix (0 = off)",
           int, _non_negative),
    Option("ntk_no_avg", "skip the per-round weight averaging (ablation of fig. 6)", flag_action="store_true"),
    Option("clients_per_round", "clients the server samples each round (centralized algorithms)", int,
           _positive),
    Option("local_steps", "a fixed number of local SGD steps instead of --local-epochs (0 = epochs)", int,
           _non_negative),
    Option("prox_mu", "FedProx proximal coefficient mu", float, _non_negative),
    Option("share_fraction", "Data Share: the global set's fraction of all clients' samples", float, _fraction),
    Option("cp_beta", "CP-NTK-FL data sampling rate beta: fraction of each client's samples per round", float,
           _fraction),
]}

NTK_DFL_DEFAULTS = {
    "lr": 0.01, "lr_decay": 0.07, "ntk_taus": [100, 200, 300, 400, 500, 600, 700, 800], "ntk_loss": "ce",
    "ntk_ode": "deflated", "ntk_selection": "network", "ntk_jacobian": "auto", "ntk_batches": 1, "ntk_subsample": 1,
    "ntk_topk": 1.0, "ntk_quant_bits": 0, "ntk_projection": 0, "ntk_no_avg": False,
}


FEDAVG_DEFAULTS = {"lr": 0.1, "batch_size": 50, "local_epochs": 5, "momentum": 0.0, "clients_per_round": 20,
                   "local_steps": 0}
FEDAVG_OPTIONS = ("clients_per_round", "local_steps")
NTK_FL_DEFAULTS = {**{k: v for k, v in NTK_DFL_DEFAULTS.items() if k != "ntk_no_avg"},
                   "lr_decay": 0.0, "clients_per_round": 20,
                   "ntk_taus": [100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1500, 2000]}
NTK_FL_OPTIONS = tuple(k for k in NTK_FL_DEFAULTS if k.startswith("ntk_")) + ("clients_per_round",)
CP_NTK_FL_DEFAULTS = {"cp_beta": 0.3, "ntk_projection": 200, "ntk_topk": 0.1, "ntk_selection": "linearized"}


@dataclass(frozen=True)
class AlgorithmSpec:
    name: str
    module: str
    cls: str
    summary: str
    defaults: dict[str, Any] = field(default_factory=dict)
    options: tuple[str, ...] = ()
    centralized: bool = False  # a star whose hub (node `peers`, rank 0) is the server

    def check_extras(self, cfg) -> None:
        for name, value in cfg.extras.items():
            if name not in self.options:
                raise UserError(f"--{name.replace('_', '-')} does not apply to --algo {self.name}")
            check = OPTIONS[name].check
            problem = check(value) if check else None
            if problem:
                raise UserError(f"--{name.replace('_', '-')} {problem}")

    def build(self, ctx):
        module = importlib.import_module(f"p2pfl.algorithms.{self.module}")
        return getattr(module, self.cls)(ctx)


class Registry(dict):
    def spec(self, name: str) -> AlgorithmSpec:
        return self[name]

    def extra_flags(self) -> list[Option]:
        return list(OPTIONS.values())

    def extra_fields(self) -> list[str]:
        return list(OPTIONS)


REGISTRY = Registry({s.name: s for s in [
    AlgorithmSpec("dpsgd", "dpsgd", "DPSGD", "D-PSGD (Lian et al. 2017): one SGD step per gossip round",
                  {"lr": 0.1, "batch_size": 10, "momentum": 0.0}),
    AlgorithmSpec("dfedavg", "dfedavg", "DFedAvg", "local epochs of SGD, then averaging with neighbours",
                  {"lr": 0.1, "batch_size": 25, "local_epochs": 20, "momentum": 0.0}),
    AlgorithmSpec("dfedavgm", "dfedavg", "DFedAvg", "DFedAvg with heavy-ball momentum, reset each round",
                  {"lr": 0.01, "batch_size": 50, "local_epochs": 20, "momentum": 0.9}),
    AlgorithmSpec("ntk-dfl", "ntk_dfl", "NTKDFL", "NTK-DFL: averaging, Jacobian exchange, local NTK evolution",
                  NTK_DFL_DEFAULTS, tuple(k for k in NTK_DFL_DEFAULTS if k.startswith("ntk_"))),
    *[AlgorithmSpec(name, "fedavg", cls, summary, {**FEDAVG_DEFAULTS, **extra}, FEDAVG_OPTIONS + tuple(extra),
                    centralized=True) for name, cls, summary, extra in [
        ("fedavg", "FedAvg", "FedAvg: local SGD, sample-weighted average of the sampled clients", {}),
        ("fedprox", "FedProx", "FedAvg with a proximal term mu/2 ||w - w_global||^2", {"prox_mu": 0.01}),
        ("scaffold", "Scaffold", "SCAFFOLD: control variates correct client drift", {}),
        ("fednova", "FedNova", "FedNova: normalized averaging of local progress", {}),
        ("central", "Centralized", "upper bound: the server trains on the sampled clients' data", {}),
        ("datashare", "DataShare", "FedAvg with a shared global set mixed into local training",
         {"share_fraction": 0.1}),
    ]],
    AlgorithmSpec("ntk-fl", "ntk_fl", "NTKFL", "NTK-FL: clients send Jacobians, the server evolves the global model",
                  NTK_FL_DEFAULTS, NTK_FL_OPTIONS, centralized=True),
    AlgorithmSpec("cp-ntk-fl", "ntk_fl", "NTKFL", "CP-NTK-FL: NTK-FL with sampling, projection, top-k, shuffling",
                  {**NTK_FL_DEFAULTS, **CP_NTK_FL_DEFAULTS}, NTK_FL_OPTIONS + ("cp_beta",), centralized=True),
]})
