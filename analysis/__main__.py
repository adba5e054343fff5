"""python -m analysis COMMAND ...: compare runs, draw the papers' figures, draw topologies.

python -m analysis compare RUN_DIR... [--by algo] [--out FILE]
python -m analysis figures RUNS_DIR [--out DIR]
python -m analysis topology RUN_DIR|CONFIG.toml [--out DIR]
python -m analysis graph --topology NAME --peers N [graph flags of p2pfl.run] [--out DIR]
python -m analysis tradeoff RESULTS.json --series "LABEL=GLOB:X_METRIC" ... [--y METRIC] [--out FILE]
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {  # command: (module, its function)
    "compare": ("analysis.compare", "main"),
    "figures": ("analysis.figures", "main"),
    "topology": ("analysis.topology_views", "main"),
    "graph": ("analysis.topology_views", "graph_main"),
    "tradeoff": ("analysis.tradeoff", "main"),
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(__doc__.strip(), file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module, function = COMMANDS[argv[0]]
    return getattr(importlib.import_module(module), function)(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
