"""One RunConfig for a run: defaults < TOML file < command-line flags, the algorithm's settings built in.

The flags come from the declarations (p2pfl.settings.run_config, and each algorithm's Settings). Each setting is
checked as declared; the checks across settings, the algorithm and the data live here. A bad value
raises UserError with one clear sentence, so the CLI prints one line and exits 2 instead of failing
deep inside a round.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tomllib
from pathlib import Path
from typing import Any

from p2pfl.algorithms import REGISTRY, lookup, owners_of, setting_names
from p2pfl.plugins import call_hook
from p2pfl.algorithms.server import ServerOptions
from p2pfl.runner.checkpoint.files import FOLDER as CHECKPOINTS, has_checkpoint
from p2pfl.data import DATASETS, canonical_dataset, dataset_spec
from p2pfl.errors import UserError
from p2pfl.runner.fit_checks import check_data_dir, check_out
from p2pfl.models import MODELS, model_spec
from p2pfl.settings.fields import add_flags, build, check, coerce
from p2pfl import presets
from p2pfl.runner import provenance
from p2pfl.runner.paths import check_resumable, read_regular, resolved
from p2pfl.plugins import is_reference
from p2pfl.measure.tensorboard_log import check_available
from p2pfl.runner.graph_schedule import check_topology, choices_sentence, settle
from p2pfl.threats.attacks import ATTACKS
from p2pfl.threats.byzantine import NONE, attack_named, byzantine_count, rule_named
from p2pfl.threats.robust import RULES
from p2pfl.settings.run_config import FIELDS, RESULT_NEUTRAL, TRAINING_FALLBACK, RunConfig, machine_memory

__all__ = [
    "RunConfig",
    "TRAINING_FALLBACK",
    "machine_memory",
    "make_config",
    "parse_config",
    "resolve",
    "resolved_dict",
    "validate",
]


CONFIG_HELP = (
    "TOML file of settings (keys are the flags' names), or a preset's name (python -m p2pfl.presets lists "
    "them); flags given here override it"
)


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but its errors become UserError (one line, exit 2) instead of usage + message."""

    def error(self, message):
        raise UserError(message)


def named_choices() -> dict[str, str]:
    """What --algo, --dataset and --model may name: known only above the layers that define them."""
    return {
        "algo": f"one of: {', '.join(REGISTRY)}; or package.module:Class, your own",
        "dataset": f"one of: {', '.join(DATASETS)}; or package.module:function, your own loader",
        "model": f"one of: {', '.join(MODELS)}; or package.module:function, your own",
        "topology": choices_sentence(),
        "attack": f"one of: {', '.join(ATTACKS)}; or package.module:function, your own",
        "robust_aggregation": f"{NONE} (the algorithm's mixing), on a graph "
        f"{', '.join(n for n, r in RULES.items() if 'graph' in r.applies)}, on the star "
        f"{', '.join(n for n, r in RULES.items() if 'star' in r.applies)}; or package.module:function",
    }


TRAINING_FIELDS = ("lr", "lr_decay", "batch_size", "local_epochs", "momentum", "weight_decay")


def build_parser(algo: str = "dfedavg", named: bool = False) -> argparse.ArgumentParser:
    """The run's flags, then the flags of algo's own settings (shown by --algo X --help); named: algo was
    given (--algo, a config file, a resumed run), so the defaults it sets are shown as its values."""
    listing = "; ".join(f"{name}: {cls.summary}" for name, cls in REGISTRY.items())
    prog = "p2pfl-run" if Path(sys.argv[0]).name == "p2pfl-run" else "python -m p2pfl.run"  # as the user typed it
    p = _OneLineParser(
        prog=prog,
        description="Decentralized learning on a graph of peers.",
        epilog=f"algorithms: {listing}. {prog} --algo X --help lists X's own settings.",
        argument_default=argparse.SUPPRESS,
        allow_abbrev=False,
    )
    p.add_argument("--config", help=CONFIG_HELP)
    cls = lookup(algo) if algo in REGISTRY or is_reference(algo) else None
    add_flags(p, RunConfig, algorithm_defaults(cls) if cls is not None and named else None, extra=named_choices())
    if cls is not None:
        add_flags(p.add_argument_group(f"settings of --algo {algo}"), cls.Settings, cls.setting_defaults)
    return p


def algorithm_defaults(cls) -> dict[str, Any]:
    """The run flags whose defaults an algorithm sets, as that algorithm sets them: its training table
    (lr, batch size, local epochs, ...) and its rounds (TCT's and CyclicFL's from their stages)."""
    out = {name: cls.training.get(name, TRAINING_FALLBACK.get(name)) for name in TRAINING_FIELDS}
    out["rounds"] = call_hook(cls, "rounds", build(cls.Settings, {}, cls.setting_defaults), None)
    if not cls.centralized:
        out["mixing"] = cls.mixing
    return {name: value for name, value in out.items() if value is not None}


def load_toml(path: str) -> dict[str, Any]:
    try:
        raw = tomllib.loads(read_regular(Path(path)).decode("utf-8-sig"))  # a BOM (some editors write one) is no key
    except FileNotFoundError:
        raise UserError(f"config file {path} does not exist")
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"config file {path} is not valid TOML: {exc}")
    except OSError as exc:
        raise UserError(f"config file {path} cannot be read ({exc.strerror or exc})")
    raw.pop(provenance.TABLE, None)  # a run's config.toml: which p2pfl wrote it, not a setting
    return {key.replace("-", "_"): value for key, value in raw.items()}


def _not_this_algorithm(name: str, algo: str) -> UserError | None:
    """The error for a setting that belongs to other algorithms only, or None."""
    owners = owners_of(name)
    own = lookup(algo).name if is_reference(algo) else algo
    if owners and own not in owners:
        return UserError(
            f"--{name.replace('_', '-')} does not apply to --algo {algo} (it is a setting of {', '.join(owners)})"
        )
    return None


def parse_config(argv: list[str] | None = None) -> RunConfig:
    """Merge defaults, the --config file and the flags, then validate. A resume (--resume, or a `resume`
    key in the --config file) takes the run's own config.toml, and what is given besides must agree
    with it."""
    argv = list(sys.argv[1:] if argv is None else argv)
    pre = _OneLineParser(add_help=False, allow_abbrev=False, argument_default=argparse.SUPPRESS)
    pre.add_argument("--config")
    pre.add_argument("--algo")
    pre.add_argument("--resume")
    known, _ = pre.parse_known_args(argv)
    values = load_toml(str(presets.find(known.config))) if getattr(known, "config", None) is not None else {}
    resume = _run_folder(known.resume if hasattr(known, "resume") else values.get("resume"))
    stored = _stored_config(resume) if resume is not None else {}
    algo = getattr(known, "algo", values.get("algo", stored.get("algo", "dfedavg")))
    for token in argv:
        if token.startswith("--"):
            problem = _not_this_algorithm(token[2:].split("=")[0].replace("-", "_"), str(algo))
            if problem:
                raise problem
    named = hasattr(known, "algo") or "algo" in values or "algo" in stored
    args = vars(build_parser(str(algo), named).parse_args(argv))
    args.pop("config", None)
    values.update(args)
    if resume is not None:
        values = _resume_values(str(resume), stored, values)
    return make_config(values)


# settings that change no number


def _stored_config(run_dir: str) -> dict[str, Any]:
    folder = Path(run_dir)
    if not (folder / "config.toml").is_file():
        raise UserError(f"--resume {run_dir}: no run folder there (it has no config.toml)")
    check_resumable(folder, CHECKPOINTS)
    stored = load_toml(str(folder / "config.toml"))
    if "batched" in stored:  # batch's name in run folders written before its rename (2026-11-27)
        stored["batch"] = stored.pop("batched")
    return stored


def first_difference(a: dict[str, Any], b: dict[str, Any], ignore=()) -> str | None:
    """The first setting (in name order) two resolved configs disagree on, ignoring some; None if none."""
    return next((k for k in sorted(set(a) | set(b)) if k not in ignore and a.get(k) != b.get(k)), None)


def _resume_values(run_dir: str, stored: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """A resumed run's settings: its own config.toml, its folder as --out. What is given besides (the
    command that started the run, say) must agree with config.toml; only settings that change no
    number (RESULT_NEUTRAL) may differ."""
    folder = Path(run_dir)
    config = folder / "config.toml"
    # checked without TensorBoard: whether this machine has it is a question for the resumed run's own flag
    try:
        before = resolved_dict(make_config({**stored, "tensorboard": False}))
    except UserError as exc:
        raise UserError(f"--resume {run_dir}: its config.toml is not a valid run configuration ({exc})")
    if given.get("out") is not None and Path(given["out"]).resolve() != folder.resolve():
        raise UserError(f"--resume {run_dir} writes into that folder; --out {given['out']} names another")
    after = resolved_dict(
        make_config({**stored, **{k: v for k, v in given.items() if k not in RESULT_NEUTRAL}, "tensorboard": False})
    )
    name = first_difference(before, after)
    if name:
        flag = "--" + name.replace("_", "-")
        hint = " (to train longer, start a new run)" if name == "rounds" else ""
        raise UserError(
            f"--resume continues {run_dir} as configured: {flag} is {before.get(name)!r} there, "
            f"{after.get(name)!r} here{hint}; start a new run with --config {config} for other settings"
        )
    if not has_checkpoint(folder):
        if (folder / "metrics.jsonl").is_file() and (folder / "model.pt").is_file():
            raise UserError(
                f"--resume {run_dir}: the run finished all its {before.get('rounds')} rounds (a finished "
                f"run keeps no checkpoint); to train longer, start a new run with --config {config} "
                "--rounds N"
            )
        raise UserError(f"--resume {run_dir}: the run has no checkpoint to continue from")
    values = {
        **stored,
        **{
            k: given[k]
            for k in ("comm_timeout", "progress", "checkpoint_every", "tensorboard", "drift_stop")
            if k in given
        },
    }
    values.update(out=run_dir, resume=run_dir)
    return values


def config_from_values(values: dict[str, Any], writes: bool = True) -> RunConfig:
    """make_config for a caller that is not the command line (p2pfl.simulate): a resume takes the run's
    own config.toml, and what is given besides must agree with it."""
    resume = _run_folder(values.get("resume"))
    if resume is not None:
        values = _resume_values(resume, _stored_config(resume), values)
    return make_config(values, writes)


def _run_folder(resume: Any) -> str | None:
    """--resume's folder (a `resume` key's, a keyword's), or None for no resume."""
    if resume is None:
        return None
    if isinstance(resume, Path):
        resume = str(resume)
    if not isinstance(resume, str) or not resume:
        raise UserError(f"--resume takes a run folder, not {resume!r}")
    return resume


def make_config(values: dict[str, Any], writes: bool = True) -> RunConfig:
    """A checked RunConfig from raw values (TOML or parsed flags); the algorithm's settings built in.
    writes=False: the run will write no folder (simulate's out=None), so none is checked."""
    algo = values.get("algo", "dfedavg")
    if not isinstance(algo, str):
        raise UserError(f"--algo takes an algorithm's name, not {algo!r}")
    cls = lookup(algo)
    mine = set(setting_names(algo))
    for name in values:
        problem = _not_this_algorithm(name, algo)
        if problem:
            raise problem
    unknown = sorted(set(values) - set(FIELDS) - mine)
    if unknown:
        raise UserError(f"unknown setting(s): {', '.join(unknown)}")
    # None is "the default" only where the default is None (--lr: the algorithm's); elsewhere a wrong value
    base = {
        k: coerce(FIELDS[k], v) if v is not None or FIELDS[k].default is not None else None
        for k, v in values.items()
        if k in FIELDS
    }
    for name, value in base.items():
        if value is not None:
            check(FIELDS[name], value)
    if "hidden" in base:
        base["hidden"] = list(base["hidden"])
    settings = build(cls.Settings, {k: v for k, v in values.items() if k in mine}, cls.setting_defaults)
    cfg = RunConfig(**base, settings=settings, given=frozenset(values), algorithm=cls)
    validate(cfg, writes)
    return cfg


def validate(cfg: RunConfig, writes: bool = True) -> None:
    """Checks across settings that need no data and no MPI (each setting's own check is declared with it,
    p2pfl.settings.run_config); resolve() does the rest once peers are known."""
    canonical = canonical_dataset(cfg.dataset)
    if canonical is None:
        raise UserError(
            f"unknown dataset {cfg.dataset!r}; choose one of: {', '.join(DATASETS)}, or name your own "
            "loader as package.module:function"
        )
    cfg.dataset = canonical
    spec = dataset_spec(canonical)
    if cfg.partition is None:
        cfg.partition = spec.default_partition
    if cfg.model is None:
        cfg.model = spec.default_model
    model = model_spec(cfg.model)
    if model.task != spec.task:
        raise UserError(f"--model {cfg.model} is for {model.task}, but --dataset {canonical} is a {spec.task} task")
    if spec.task not in cfg.algorithm.tasks:
        raise UserError(
            f"--algo {cfg.algo} learns {' or '.join(cfg.algorithm.tasks)} only, not the "
            f"{spec.task} task of --dataset {canonical}"
        )
    if model.images and not spec.images:
        raise UserError(f"--model {cfg.model} needs images (C, H, W); --dataset {canonical} has flat features")
    if cfg.partition == "writers" and not spec.natural_split:
        raise UserError(f"--partition writers needs a dataset with a natural split; {canonical} has none")
    settle(cfg)
    cfg.rounds = call_hook(cfg.algorithm, "rounds", cfg.settings, cfg.rounds)
    if cfg.rounds < 1:
        raise UserError(f"--rounds must be at least 1, got {cfg.rounds}")
    call_hook(cfg.algorithm, "check", cfg)
    check_threats(cfg, spec.task)
    check_network(cfg)
    if cfg.tensorboard:
        if not writes:
            raise UserError("tensorboard=True writes into the run folder: give out=")
        check_available()
    if cfg.partition_file is not None:
        if not Path(cfg.partition_file).is_file():
            raise UserError(f"--partition-file {cfg.partition_file}: no such file")
        if cfg.train_samples is not None:
            raise UserError("--partition-file indexes the whole training set; --train-samples would renumber it")
        cfg.partition_file = resolved(cfg.partition_file, "--partition-file")
    if cfg.labels != "fine" and canonical != "cifar100":
        raise UserError(f"--labels {cfg.labels} applies to --dataset cifar100 only, not {canonical}")
    check_data_dir(cfg, spec)
    if cfg.peers is not None:
        check_peers(cfg, cfg.peers)
    if writes:
        check_out(cfg)


def check_network(cfg: RunConfig) -> None:
    """The network model's flags (p2pfl.comm.clock): a step time once, its spreads only with it, and not
    beside the faults' unit clock's stragglers and deadline; graph runs only (a star's clients download,
    train, then upload, an order the clock does not model)."""
    given = [
        flag
        for flag, on in (
            ("--step-time", cfg.step_time is not None),
            ("--step-time-file", bool(cfg.step_time_file)),
            ("--peer-flops", cfg.peer_flops is not None),
        )
        if on
    ]
    timed = bool(given)
    if len(given) > 1:
        raise UserError(f"{given[0]} and {given[1]} both give the step time: give one")
    for name in ("step_time_spread", "slower_peers"):  # by value: a resumed run's config.toml gives every setting
        if getattr(cfg, name) > 0 and cfg.step_time is None and cfg.peer_flops is None:
            raise UserError(f"--{name.replace('_', '-')} spreads --step-time: give --step-time S (or --peer-flops F)")
    if timed and cfg.slow_peers > 0:
        raise UserError(
            "--slow-peers belongs to the faults' unit clock (with its --round-deadline); with --step-time slow peers "
            "are --slower-peers or --step-time-spread, and a round lasts until its last message arrives"
        )
    linked = cfg.link_latency > 0 or cfg.link_bandwidth is not None or cfg.link_spread > 0
    churned = cfg.churn > 0 or bool(cfg.availability_file)
    if cfg.churn > 0 and cfg.availability_file:
        raise UserError("--churn and --availability-file both say when peers are away: give one")
    if cfg.algorithm.centralized and churned:
        raise UserError(
            f"--algo {cfg.algo}: peers leaving and coming back act on graph runs; a star's are not modelled"
        )
    if cfg.algorithm.centralized and (timed or linked):
        raise UserError(
            f"--algo {cfg.algo}: the network model times graph runs (work, then exchanges); a star's clients "
            "download, train and upload, which it does not model yet"
        )


def check_threats(cfg: RunConfig, task: str) -> None:
    """Byzantine peers and robust rules: for the algorithms whose averaging takes them, an attack only with
    attackers, the names (or a user's functions) checked where they enter."""
    wanted = cfg.byzantine > 0 or cfg.robust_aggregation != NONE
    if wanted and not cfg.algorithm.withstands_threats:
        able = ", ".join(name for name, cls in REGISTRY.items() if cls.withstands_threats)
        raise UserError(
            f"--byzantine and --robust-aggregation act on the averaging of {able}; --algo {cfg.algo} does not take them"
        )
    for name in ("attack", "attack_scale"):
        if name in cfg.given and not cfg.byzantine:
            raise UserError(f"--{name.replace('_', '-')} needs Byzantine peers: give --byzantine N")
    if cfg.dp_clip or cfg.dp_noise:
        if not cfg.algorithm.private_training:
            able = ", ".join(name for name, cls in REGISTRY.items() if cls.private_training)
            raise UserError(f"--dp-clip trains with DP-SGD in {able}; --algo {cfg.algo} does not")
        if not (cfg.dp_clip and cfg.dp_noise):
            raise UserError(
                "differential privacy needs both --dp-clip C (each sample's gradient clipped to C) and --dp-noise S "
                "(noise of S * C): without noise no epsilon is finite, without a clip the noise bounds nothing"
            )
    if "dp_delta" in cfg.given and not cfg.dp_clip:
        raise UserError("--dp-delta states the privacy of a DP-SGD run: give --dp-clip and --dp-noise")
    attack = attack_named(cfg.attack)
    rule_named(cfg.robust_aggregation, "star" if cfg.algorithm.centralized else "graph")
    if cfg.byzantine and getattr(attack, "poisons_labels", False) and task != "classification":
        raise UserError(f"--attack {cfg.attack} flips class labels; --dataset {cfg.dataset} is a {task} task")


def check_peers(cfg: RunConfig, peers: int) -> None:
    """Checks that depend on the number of peers (known only once MPI is up when --peers is absent)."""
    if cfg.algorithm.centralized:  # a star of the clients around the server always exists
        cfg.mixing = cfg.mixing or "uniform"  # the server's average is sample-weighted; no graph mixes
        if isinstance(cfg.settings, ServerOptions) and cfg.settings.clients_per_round > peers:
            if "clients_per_round" in cfg.given:
                raise UserError(f"--clients-per-round {cfg.settings.clients_per_round} exceeds the {peers} clients")
            cfg.settings = dataclasses.replace(cfg.settings, clients_per_round=peers)  # the default: at most all
        return
    check_topology(cfg, peers)
    byzantine_count(cfg.byzantine, peers)


def resolve(cfg: RunConfig, world_size: int) -> RunConfig:
    """Fill what depends on the launch: the number of peers and the algorithm's training defaults."""
    if cfg.peers is None:
        cfg.peers = world_size if world_size > 1 else 10
        check_peers(cfg, cfg.peers)
    if cfg.peers < world_size:
        raise UserError(f"{cfg.peers} peers cannot fill {world_size} MPI ranks; use --peers >= {world_size}")
    cls = cfg.algorithm
    if cls.centralized:
        cfg.topology = "star"  # the server is the hub; --topology does not apply
    for name in TRAINING_FIELDS:
        if getattr(cfg, name) is None:
            setattr(cfg, name, cls.training.get(name, TRAINING_FALLBACK.get(name)))
    return cfg


def resolved_dict(cfg: RunConfig) -> dict[str, Any]:
    """Every setting as resolved, the algorithm's own included; not `out` (nor `overwrite`, `resume`), so
    that --config on a run's config.toml never writes into that run's folder."""
    out = {k: v for k in FIELDS if (v := getattr(cfg, k)) is not None and k not in ("out", "overwrite", "resume")}
    out.update({k: v for k, v in dataclasses.asdict(cfg.settings).items() if v is not None})  # TOML has no None
    for name, applies in APPLIES.items():  # a setting at its default where it takes no part: not written
        if name in out and not applies(cfg) and out[name] == FIELDS[name].default:
            out.pop(name)
    if cfg.partition_file is not None:  # the file is the partition: these settings take no part in the run
        for name in REPLACED_BY_PARTITION_FILE:
            if not (name == "samples_per_peer" and cfg.dataset == "linear-rep"):  # it draws that many samples
                out.pop(name, None)
    return out


APPLIES = {  # settings that take part in some runs only: where each does
    "labels": lambda cfg: "cifar100" in str(cfg.dataset).lower().replace("-", ""),
    "norm": lambda cfg: str(cfg.model).startswith("resnet"),
    "classes_style": lambda cfg: cfg.partition == "classes",
    "dirichlet_style": lambda cfg: cfg.partition == "dirichlet",
    "attack": lambda cfg: cfg.byzantine > 0,
    "attack_scale": lambda cfg: cfg.byzantine > 0,
    "robust_bound": lambda cfg: cfg.robust_aggregation != NONE,
    "clip_radius": lambda cfg: cfg.robust_aggregation != NONE,  # clipping's; a rule of your own may read it too
    "dp_delta": lambda cfg: cfg.dp_clip > 0,
}


REPLACED_BY_PARTITION_FILE = (
    "partition",
    "alpha",
    "dirichlet_style",
    "classes_per_peer",
    "classes_style",
    "samples_per_peer",
)
