"""Build a run's context in-process, for tests that poke at one round."""

from p2pfl.configure import make_config, resolve
from p2pfl.assemble import build


def make_context(**settings):
    values = {"dataset": "synthetic", "peers": 8, "kappa": 3, "progress": False, **settings}
    cfg = resolve(make_config(values), 1)
    return build(cfg, 0, 1, 0)


def metric_lines(run_dir):
    import json

    from p2pfl.testing import MACHINE_FACTS

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in MACHINE_FACTS} for row in rows]
