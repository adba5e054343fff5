import dataclasses
import gzip
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from p2pfl.threads import POOLS  # p2pfl starts no thread pool on import (torch comes later)

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("P2PFL_NO_DOWNLOAD", "1")
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
# One OpenMP thread a process (torch's pool, set before torch starts; the runs and ranks the tests start
# inherit it): two workers on two cores and the runs they start spun their pools against each other.
# No result depends on it (a run is the same on any thread count; test_pixels sets counts of its own).
for _pool in POOLS:
    os.environ.setdefault(_pool, "1")


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
            images[labels == c, c * 2 : c * 2 + 3, :] = 250
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
            images[labels == c, 5 * c : 5 * c + 3, :] = 250
        write_idx(root / f"{split}-images-idx3-ubyte", images)
        write_idx(root / f"{split}-labels-idx1-ubyte", labels)
    return root


from p2pfl import testing  # noqa: E402
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


@pytest.fixture
def int8_codes(monkeypatch):
    """The NTK's 8-bit pixel codes taken on this CPU, whether or not it has 8-bit dot-product instructions
    (without them the runs take float32 products, which are faster there)."""
    from p2pfl.ntk import pixels

    monkeypatch.setattr(pixels, "int8_products_fast", lambda: True)


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
    if argv and (
        argv[0] == sys.executable
        or program.startswith("python")
        or program in ("bash", "sh")
        or program.endswith(".sh")
        or program.startswith("p2pfl")
    ):
        return "subprocess"
    return None


# Every Python interpreter the suite starts counts itself (mpirun's ranks, the runs the launch tools start,
# scripts): a sitecustomize on PYTHONPATH appends a line naming the test that was running (pytest's
# PYTEST_CURRENT_TEST, inherited) to the tally. xdist's workers, the suite itself, do not count.
_COUNTER = """import os
if os.environ.get("P2PFL_LAUNCH_TALLY"):
    try:
        with open("/proc/self/cmdline", "rb") as own:
            worker = b"exec(eval(sys.stdin.readline()))" in own.read()
    except OSError:
        worker = False
    if not worker:
        with open(os.environ["P2PFL_LAUNCH_TALLY"], "a") as tally:
            tally.write("interpreter " + os.environ.get("PYTEST_CURRENT_TEST", "-").rsplit(" (", 1)[0] + "\\n")
"""


def pytest_configure(config):
    """One tally file of the suite's launches, shared with xdist's workers and every process they start
    through the environment."""
    if "P2PFL_LAUNCH_TALLY" not in os.environ and not hasattr(config, "workerinput"):
        import tempfile

        handle, path = tempfile.mkstemp(prefix="p2pfl-launches-")
        os.close(handle)
        os.environ["P2PFL_LAUNCH_TALLY"] = path
        counter = Path(tempfile.mkdtemp(prefix="p2pfl-counter-"))
        (counter / "sitecustomize.py").write_text(_COUNTER)
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(counter), os.environ.get("PYTHONPATH")]))


def _tally_mpirun(test: str) -> None:
    """One line in the suite's tally for an mpirun launch (its ranks count themselves)."""
    if os.environ.get("P2PFL_LAUNCH_TALLY"):
        with open(os.environ["P2PFL_LAUNCH_TALLY"], "a") as tally:
            tally.write(f"mpirun {test}\n")


def pytest_terminal_summary(terminalreporter, config):
    """How many mpirun launches and fresh interpreters the run started, and the tests that started most."""
    from collections import Counter

    path = os.environ.get("P2PFL_LAUNCH_TALLY")
    if hasattr(config, "workerinput") or not path or not Path(path).exists():
        return
    launches = [line.split(" ", 1) for line in Path(path).read_text().splitlines() if " " in line]
    interpreters = Counter(test for kind, test in launches if kind == "interpreter")
    most = ", ".join(f"{test.split('::', 1)[-1]} {n}" for test, n in interpreters.most_common(3))
    terminalreporter.write_line(
        f"launches: {sum(kind == 'mpirun' for kind, _ in launches)} mpirun, "
        f"{sum(interpreters.values())} fresh interpreters (mpirun's ranks and the tools' runs "
        f"included; most: {most or 'none'})"
    )
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
        if kind == "mpi":
            _tally_mpirun(request.node.nodeid)
        real(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", record)
    yield
    marks = {m.name for m in request.node.iter_markers()}
    missing = sorted(k for k in kinds if k not in marks and not (k == "subprocess" and "mpi" in marks))
    if missing:
        pytest.fail(f"this test {LAUNCH_MARKS[missing[0]]}: mark it @pytest.mark.{missing[0]}", pytrace=False)


def run_cli(*args: str, ranks: int = 0, timeout: float = 600) -> subprocess.CompletedProcess:
    """The CLI in a fresh interpreter, or on `ranks` MPI ranks."""
    cmd = [sys.executable, "-m", "p2pfl.run", *args]
    return subprocess.run(
        testing.mpirun_command(ranks, *cmd) if ranks else cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def run_here(*args: str) -> subprocess.CompletedProcess:
    """The CLI in this test process, as run_cli without ranks returns it: the one-process side of a
    comparison with mpirun."""
    return testing.run_in_process(list(args))


# Runs on several MPI ranks, shared by the whole session: a test declares its case (ranks and CLI
# arguments) with @ranked_cases, and the first test that needs one starts one mpirun per rank count for
# every selected test's case (each rank loads torch once, not once a case). The test then gets its case
# through the `ranked_run` fixture and compares it with one process.
_RANKED = "_p2pfl_ranked_cases"


def ranked_cases(cases: dict) -> callable:
    """Marks a test mpi and names its multi-rank run: {its parameter id ("" when not parametrized):
    (ranks, arguments)}, where the arguments may be a function of a folder for the case's own data."""

    def mark(test):
        setattr(test, _RANKED, cases)
        return pytest.mark.mpi(test)

    return mark


@dataclasses.dataclass
class RankedRun:
    args: list[str]  # without --out
    ranks: int
    out: Path  # the run folder the ranks wrote
    result: subprocess.CompletedProcess  # its exit status, rank 0's stdout and stderr

    def same_as_one_process(self, workdir: Path) -> Path:
        """The same arguments run in this process into workdir/one: every metric, final.json and model.pt
        equal (p2pfl.testing.check_same_as_one_process); returns the one-process run's folder."""
        testing.check_same_as_one_process(self.args, workdir, self.out, self.result, self.ranks)
        return workdir / "one"


def _case_of(item):
    cases = getattr(getattr(item, "function", None), _RANKED, None)
    if cases is not None:
        return cases[item.callspec.id if hasattr(item, "callspec") else ""]


@pytest.fixture(scope="session")
def _ranked_runs(request, tmp_path_factory) -> dict[str, RankedRun]:
    """Every selected test's case, run once per session: xdist's workers share the result through their
    common temporary folder, the first worker to need it running it under a lock."""
    import fcntl
    import json

    worker = os.environ.get("PYTEST_XDIST_WORKER")
    shared = tmp_path_factory.getbasetemp().parent if worker else tmp_path_factory.getbasetemp()
    folder, done = shared / "ranked", shared / "ranked.json"
    with open(shared / "ranked.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            done.write_text(json.dumps(_run_ranked_cases(request.session.items, folder, request.node.nodeid)))
    return {
        test: RankedRun(
            case["args"],
            case["ranks"],
            Path(case["out"]),
            subprocess.CompletedProcess(case["args"], case["code"], case["stdout"], case["stderr"]),
        )
        for test, case in json.loads(done.read_text()).items()
    }


def _run_ranked_cases(items, folder: Path, test: str) -> dict:
    """One mpirun per rank count (on the CPU, as every test but cuda ones) for the cases of `items`."""
    by_ranks: dict[int, dict[str, list[str]]] = {}
    cases = {}
    for item in items:
        case = _case_of(item)
        if case is None:
            continue
        ranks, args = case
        name = f"case{len(cases)}"
        data = folder / name / "data"
        data.mkdir(parents=True)
        args = [str(a) for a in (args(data) if callable(args) else args)]
        out = folder / name / "ranks"
        by_ranks.setdefault(ranks, {})[name] = [*args, "--out", str(out)]
        cases[item.nodeid] = {"name": name, "args": args, "ranks": ranks, "out": str(out)}
    ended = {}
    with pytest.MonkeyPatch.context() as env:
        env.setenv("CUDA_VISIBLE_DEVICES", "")
        for ranks, batch in sorted(by_ranks.items()):
            _tally_mpirun(test)
            for name, result in testing.run_many_under_mpirun(batch, ranks, folder / f"ranks{ranks}").items():
                ended[name] = {"code": result.returncode, "stdout": result.stdout, "stderr": result.stderr}
    return {test: {**case, **ended[case["name"]]} for test, case in cases.items()}


@pytest.fixture
def ranked_run(request, _ranked_runs) -> RankedRun:
    """This test's run on several ranks (its @ranked_cases entry), made by the session's shared mpirun."""
    return _ranked_runs[request.node.nodeid]


def _images(rng, n, shape, labels):
    images = rng.integers(0, 60, size=(n, *shape)).astype(np.uint8)
    for c in np.unique(labels):  # a bright class-specific band makes the classes learnable
        images[labels == c, ..., (c * 3) % shape[-2] : (c * 3) % shape[-2] + 3, :] = 250
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
                pickle.dump(
                    {b"data": x, b"fine_labels": fine.tolist(), b"coarse_labels": coarse.tolist()}, fh, protocol=2
                )
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
