import gzip
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("P2PFL_NO_DOWNLOAD", "1")
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")


def write_idx(path: Path, array: np.ndarray, gz: bool = True) -> Path:
    codes = {np.dtype(np.uint8): 0x08}
    header = bytes([0, 0, codes[array.dtype], array.ndim]) + struct.pack(">" + "I" * array.ndim, *array.shape)
    raw = header + array.tobytes()
    if gz:
        path = path.with_name(path.name + ".gz")
        with gzip.open(path, "wb") as fh:
            fh.write(raw)
    else:
        path.write_bytes(raw)
    return path


@pytest.fixture
def tiny_mnist(tmp_path) -> Path:
    """A tiny dataset in MNIST's IDX format: 600 train and 100 test 28x28 images, 10 classes."""
    rng = np.random.default_rng(0)
    for split, n in (("train", 600), ("t10k", 100)):
        labels = (np.arange(n) % 10).astype(np.uint8)
        images = rng.integers(0, 50, size=(n, 28, 28)).astype(np.uint8)
        for c in range(10):  # a bright class-specific stripe makes the classes learnable
            images[labels == c, c * 2:c * 2 + 3, :] = 250
        write_idx(tmp_path / f"{split}-images-idx3-ubyte", images)
        write_idx(tmp_path / f"{split}-labels-idx1-ubyte", labels)
    return tmp_path


def mpirun() -> str | None:
    exe = Path(sys.executable).parent / "mpirun"
    return str(exe) if exe.exists() else None


def run_cli(*args: str, ranks: int = 0, timeout: float = 600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "p2pfl.run", *args]
    if ranks:
        cmd = [mpirun(), "-n", str(ranks), "--oversubscribe", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
