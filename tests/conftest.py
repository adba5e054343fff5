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
    codes = {np.dtype(np.uint8): 0x08, np.dtype(np.int8): 0x09}
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


def write_stripes(root: Path, classes: int, n_train: int, n_test: int) -> Path:
    """MNIST-format IDX files of `classes` learnable classes (a bright band per class), labels cycling."""
    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("t10k", n_test)):
        labels = (np.arange(n) % classes).astype(np.uint8)
        images = rng.integers(0, 60, (n, 28, 28)).astype(np.uint8)
        for c in range(classes):
            images[labels == c, 5 * c:5 * c + 3, :] = 250
        write_idx(root / f"{split}-images-idx3-ubyte", images)
        write_idx(root / f"{split}-labels-idx1-ubyte", labels)
    return root


from p2pfl.testing import mpirun  # noqa: E402,F401 - the one lookup of Open MPI's launcher


@pytest.fixture(autouse=True)
def cpu_unless_marked_cuda(request, monkeypatch):
    """Tests run on the CPU, on a GPU machine too: the bit-exact checks (1 process = 3 ranks, resume =
    uninterrupted) are CPU facts, and `--device auto` would pick the GPU. In this process torch sees no
    GPU; runs it starts (subprocesses, mpirun's ranks) see none either. Tests marked cuda see the GPU and
    compare it with the CPU."""
    if request.node.get_closest_marker("cuda") is not None:
        return
    import torch

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


LAUNCH_MARKS = {"mpi": "starts mpirun", "subprocess": "starts a fresh interpreter or a script"}


def _argv(args) -> list[str]:
    """A command line as Popen takes it (a list, or a string for a shell) as a list of words."""
    return [str(a) for a in args] if isinstance(args, (list, tuple)) else str(args).split()


def _launch_kind(args) -> str | None:
    """'mpi' for an mpirun command line, 'subprocess' for another interpreter or script; None for the
    helper programs libraries start on their own (a compiler probe, ldconfig)."""
    argv = _argv(args)
    program = Path(argv[0]).name if argv else ""
    if "mpirun" in program or any(Path(a).name == "mpirun.sh" for a in argv):
        return "mpi"
    if argv and (argv[0] == sys.executable or program.startswith("python") or program in ("bash", "sh")
                 or program.endswith(".sh") or program.startswith("p2pfl")):
        return "subprocess"
    return None


def _ranks(args) -> int:
    """The ranks of an mpirun command line (-n N, or launch/mpirun.sh N)."""
    argv = _argv(args)
    for i, arg in enumerate(argv[:-1]):
        if (arg in ("-n", "-np") or Path(arg).name == "mpirun.sh") and argv[i + 1].isdigit():
            return int(argv[i + 1])
    return 1


def pytest_configure(config):
    """One tally file of the suite's launches, shared with xdist's workers through the environment."""
    if "P2PFL_LAUNCH_TALLY" not in os.environ and not hasattr(config, "workerinput"):
        import tempfile

        handle, path = tempfile.mkstemp(prefix="p2pfl-launches-")
        os.close(handle)
        os.environ["P2PFL_LAUNCH_TALLY"] = path


def pytest_terminal_summary(terminalreporter, config):
    """How many mpirun launches and fresh interpreters (an mpirun's ranks included) the run started."""
    path = os.environ.get("P2PFL_LAUNCH_TALLY")
    if hasattr(config, "workerinput") or not path or not Path(path).exists():
        return
    lines = Path(path).read_text().split()
    ranks = sum(int(line.split(":")[1]) for line in lines if line.startswith("mpi:"))
    terminalreporter.write_line(f"launches: {sum(line.startswith('mpi:') for line in lines)} mpirun, "
                                f"{lines.count('subprocess') + ranks} fresh interpreters (mpirun's ranks included)")
    Path(path).unlink()


@pytest.fixture(autouse=True)
def launches_are_marked(request, monkeypatch):
    """A test that starts mpirun, or a fresh interpreter or script, carries the marker (mpi, subprocess)
    that `make test-fast` leaves out: the fast tier never starts one, and the markers stay true as tests
    change (a launch without its marker fails the test, naming the marker)."""
    kinds = set()
    real = subprocess.Popen.__init__

    def record(self, args, *rest, **kwargs):
        argv = _argv(args)
        kind = _launch_kind(argv)
        if kind:
            kinds.add(kind)
            if os.environ.get("P2PFL_LAUNCH_TALLY"):
                with open(os.environ["P2PFL_LAUNCH_TALLY"], "a") as tally:
                    tally.write(f"mpi:{_ranks(argv)}\n" if kind == "mpi" else "subprocess\n")
        real(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", record)
    yield
    marks = {m.name for m in request.node.iter_markers()}
    missing = sorted(k for k in kinds if k not in marks and not (k == "subprocess" and "mpi" in marks))
    if missing:
        pytest.fail(f"this test {LAUNCH_MARKS[missing[0]]}: mark it @pytest.mark.{missing[0]}", pytrace=False)


def run_cli(*args: str, ranks: int = 0, timeout: float = 600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "p2pfl.run", *args]
    if ranks:
        cmd = [mpirun(), "-n", str(ranks), "--oversubscribe", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def run_here(*args: str) -> subprocess.CompletedProcess:
    """The CLI run in this test process, as run_cli without ranks returns it: the one-process side of a
    comparison with mpirun, without an interpreter and torch starting (about 2.5 s a run). Results do
    not depend on what ran before in the process (every draw is keyed); torch's thread count is restored."""
    import contextlib
    import io

    import torch

    from p2pfl.run import main

    out, err, threads = io.StringIO(), io.StringIO(), torch.get_num_threads()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
    finally:
        torch.set_num_threads(threads)
    return subprocess.CompletedProcess(["p2pfl.run", *args], code, out.getvalue(), err.getvalue())


def _images(rng, n, shape, labels):
    images = rng.integers(0, 60, size=(n, *shape)).astype(np.uint8)
    for c in np.unique(labels):  # a bright class-specific band makes the classes learnable
        images[labels == c, ..., (c * 3) % shape[-2]:(c * 3) % shape[-2] + 3, :] = 250
    return images


def write_cifar(root: Path, name: str = "cifar10", kind: str = "binary", n_train: int = 60, n_test: int = 20) -> Path:
    """Tiny CIFAR files in the official layouts: binary records or python-version pickles."""
    import pickle

    rng = np.random.default_rng(1)
    fine_classes = 10 if name == "cifar10" else 100
    splits = {"train": n_train, "test": n_test}
    data = {}
    for split, n in splits.items():
        fine = (np.arange(n) % fine_classes).astype(np.uint8)
        data[split] = (_images(rng, n, (3, 32, 32), fine % 10).reshape(n, -1), fine, (fine // 5).astype(np.uint8))
    if name == "cifar10":
        folder = root / ("cifar-10-batches-bin" if kind == "binary" else "cifar-10-batches-py")
        folder.mkdir(parents=True)
        train_files = [f"data_batch_{i}" for i in range(1, 6)]
        parts = np.array_split(np.arange(n_train), 5)
        for fname, idx in zip(train_files, parts):
            x, y, _ = (a[idx] for a in data["train"])
            if kind == "binary":
                (folder / f"{fname}.bin").write_bytes(np.concatenate([y[:, None], x], 1).tobytes())
            else:
                with (folder / fname).open("wb") as fh:
                    pickle.dump({b"data": x, b"labels": y.tolist()}, fh, protocol=2)
        x, y, _ = data["test"]
        if kind == "binary":
            (folder / "test_batch.bin").write_bytes(np.concatenate([y[:, None], x], 1).tobytes())
        else:
            with (folder / "test_batch").open("wb") as fh:
                pickle.dump({b"data": x, b"labels": y.tolist()}, fh, protocol=2)
        return folder
    folder = root / ("cifar-100-binary" if kind == "binary" else "cifar-100-python")
    folder.mkdir(parents=True)
    for split in ("train", "test"):
        x, fine, coarse = data[split]
        if kind == "binary":
            (folder / f"{split}.bin").write_bytes(np.concatenate([coarse[:, None], fine[:, None], x], 1).tobytes())
        else:
            with (folder / split).open("wb") as fh:
                pickle.dump({b"data": x, b"fine_labels": fine.tolist(), b"coarse_labels": coarse.tolist()}, fh,
                            protocol=2)
    return folder


def write_femnist(root: Path, writers: int = 5, per_writer: int = 12) -> Path:
    """Tiny LEAF FEMNIST JSON files (two train files, one test file) under root/femnist/data."""
    import json

    rng = np.random.default_rng(2)
    base = root / "femnist" / "data"
    for split in ("train", "test"):
        (base / split).mkdir(parents=True)
    users = [f"f{i:04d}_{i}" for i in range(writers)]
    for split, n in (("train", per_writer), ("test", 4)):
        blobs = [{"users": [], "num_samples": [], "user_data": {}} for _ in range(2 if split == "train" else 1)]
        for i, user in enumerate(users):
            y = rng.integers(0, 62, size=n)
            x = _images(rng, n, (28, 28), y % 9).reshape(n, -1) / 255.0
            blob = blobs[i % len(blobs)]
            blob["users"].append(user)
            blob["num_samples"].append(n)
            blob["user_data"][user] = {"x": x.round(3).tolist(), "y": y.tolist()}
        for j, blob in enumerate(blobs):
            (base / split / f"all_data_{j}_{split}.json").write_text(json.dumps(blob))
    return base
