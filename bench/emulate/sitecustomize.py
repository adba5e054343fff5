"""Emulates a machine that lacks some Python modules (the device check's rehearsal, tests/test_gpu_check.py):
with this folder first on PYTHONPATH, every top-level module named in $P2PFL_BLOCK_MODULES (comma-separated)
fails to import as if it were not installed, unless it lies in a folder of $P2PFL_BLOCK_EXCEPT (what the
check carries to that machine). Python imports this file at start-up (site's sitecustomize hook)."""

import importlib.machinery
import os
import sys

BLOCKED = {m for m in os.environ.get("P2PFL_BLOCK_MODULES", "").split(",") if m}
CARRIED = [p for p in os.environ.get("P2PFL_BLOCK_EXCEPT", "").split(os.pathsep) if p]


class _Lacking:
    """A finder ahead of the others: a blocked module comes from the carried folders or not at all."""

    def find_spec(self, name, path=None, target=None):
        if "." in name or name not in BLOCKED:
            return None  # a submodule's parent was already found where it was allowed
        spec = importlib.machinery.PathFinder.find_spec(name, CARRIED) if CARRIED else None
        if spec is None:
            raise ModuleNotFoundError(f"No module named {name!r} (not on the emulated machine)", name=name)
        return spec


if BLOCKED:
    sys.meta_path.insert(0, _Lacking())
