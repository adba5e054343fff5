"""Prepare the folder the device check carries to a bare GPU machine: the pure-Python modules p2pfl needs
that such a machine lacks, copied from this interpreter's installation into FOLDER/site (the check puts it
on PYTHONPATH), and Fashion-MNIST's four .gz files into FOLDER/fashion-mnist (the check sets $P2PFL_DATA
there). Nothing is downloaded. Refuses a module with compiled parts (the GPU machine's Python differs from
this one) and a folder over the 64 MiB a device call carries.

    python bench/gpu_carry.py [FOLDER]        (default .gpu-carry; make gpu-carry)
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import sys
from pathlib import Path

LACKING = ("tomli_w",)  # installed by `make install`, absent on the GPU machine (its package list)
FMNIST = Path("/usr/share/datasets/fashion-mnist")
CARRY_LIMIT = 64 * 2**20  # what a device call carries beside the working tree, at most


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def prepare(folder: Path, modules=LACKING, data: Path | None = FMNIST) -> int:
    """The carried folder, built anew; returns its size in bytes."""
    if folder.exists():
        shutil.rmtree(folder)
    site = folder / "site"
    site.mkdir(parents=True)
    for name in modules:
        source = Path(importlib.import_module(name).__file__).parent
        if any(source.rglob("*.so")) or any(source.rglob("*.pyd")):
            raise SystemExit(f"gpu-carry: {name} has compiled parts; carry a wheel built for the GPU machine")
        shutil.copytree(source, site / name, ignore=shutil.ignore_patterns("__pycache__"))
    if data is not None and data.is_dir():
        (folder / "fashion-mnist").mkdir()
        for f in sorted(data.glob("*-ubyte.gz")):
            shutil.copy(f, folder / "fashion-mnist" / f.name)
    size = folder_bytes(folder)
    if size > CARRY_LIMIT:
        raise SystemExit(f"gpu-carry: {folder} holds {size / 2**20:.1f} MiB, over the {CARRY_LIMIT >> 20} MiB carried")
    return size


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", nargs="?", default=".gpu-carry")
    a = p.parse_args()
    size = prepare(Path(a.folder))
    data = (
        "with Fashion-MNIST" if (Path(a.folder) / "fashion-mnist").is_dir() else "without data (no Fashion-MNIST here)"
    )
    print(f"{a.folder}: {', '.join(LACKING)} {data}, {size / 2**20:.1f} MiB (a device call carries at most 64)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
