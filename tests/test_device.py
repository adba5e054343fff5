"""The device is the run's: what a CPU can check of it (the GPU side: tests/test_conformance.py -m cuda and
bench/gpu_smoke.py)."""

import numpy as np
import pytest
import torch

from p2pfl.gossip.bitpack import pack_mask, unpack_mask
from p2pfl.runner.run_folder import device_note
from tests.conftest import run_here
from tests.helpers import make_context

ARGS = ["--dataset", "synthetic", "--peers", "6", "--kappa", "2", "--rounds", "2", "--no-progress"]


@pytest.mark.parametrize("n", [1, 7, 8, 9, 1000])
def test_mask_packing_is_numpys_bit_order_and_round_trips(n):
    mask = torch.from_numpy(np.random.default_rng(n).random(n) < 0.3)
    packed = pack_mask(mask)
    assert packed.dtype == torch.uint8 and np.array_equal(packed.numpy(), np.packbits(mask.numpy()))
    assert torch.equal(unpack_mask(packed, n), mask)


def test_device_note_names_each_ranks_device():
    assert device_note(["cpu"]) == "device cpu"
    assert device_note(["cpu"] * 3) == "device cpu on all 3 ranks"


def test_the_context_holds_every_tensor_on_the_runs_device():
    ctx, algo = make_context(algo="dpsgd", model="mlp")
    tensors = [
        ctx.flat,
        ctx.data.train_x,
        ctx.data.train_y,
        ctx.data.test_x,
        ctx.data.test_y,
        ctx.indices(0),
        *ctx.samples(1),
        *ctx.rows(torch.tensor([0, 1])),
    ]
    assert {t.device for t in tensors} == {ctx.device} and ctx.transport.device == ctx.device
    assert ctx.stack.device == ctx.device
    assert ctx.indices(0) is ctx.indices(0)  # moved once


def test_config_records_the_device_and_cpu_runs_have_no_gpu_peak(tmp_path):
    assert run_here(*ARGS, "--out", str(tmp_path / "r")).returncode == 0
    assert "# device cpu" in (tmp_path / "r" / "config.toml").read_text()
    assert "peak_gpu_mb" not in (tmp_path / "r" / "metrics.jsonl").read_text()


def test_running_out_of_gpu_memory_is_one_line_naming_the_knobs(tmp_path, monkeypatch):
    from p2pfl.algorithms.graph.dfedavg import DFedAvg

    def out_of_memory(self, k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(DFedAvg, "round", out_of_memory)
    result = run_here(*ARGS, "--algo", "dfedavg", "--out", str(tmp_path / "r"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("p2pfl: error: out of GPU memory"), result.stderr
    assert "peers per rank" in lines[0] and "--samples-per-peer" in lines[0] and "--model" in lines[0]


def test_initial_weights_are_drawn_on_a_copy_and_leave_the_model_alone():
    """The server's model is on the run's device when the star algorithms draw its weights (on a GPU,
    drawing in place from the CPU's keyed generator crashed): they are drawn on a CPU copy."""
    from p2pfl.models import MLP, initial_parameters

    model = MLP(20, [8], 3)
    before = [p.clone() for p in model.parameters()]
    a = initial_parameters(model, [0, 1], seed=5, init="different", device=torch.device("cpu"))
    assert all(torch.equal(x, y) for x, y in zip(model.parameters(), before))
    assert torch.equal(a, initial_parameters(model, [0, 1], seed=5, init="different", device=torch.device("cpu")))
    assert not torch.equal(a[0], a[1])


def test_tests_see_no_gpu_unless_marked_cuda():
    """The suite is the CPU suite on a GPU machine too (tests/conftest.py): auto picks the CPU here."""
    import os

    from p2pfl.runner.assemble import pick_device

    assert os.environ["CUDA_VISIBLE_DEVICES"] == "" and not torch.cuda.is_available()
    assert pick_device("auto", 0) == torch.device("cpu")


@pytest.mark.parametrize(
    "choice,gpus,needle",
    [
        ("cuda:7", 2, "this machine has 2 GPUs (cuda:0 to cuda:1)"),
        ("cuda:1", 1, "this machine has 1 GPU (cuda:0)"),
        ("cuda", 0, "no CUDA device is available here"),
        ("cuda:0", 0, "no CUDA device is available here"),
    ],
)
def test_a_gpu_that_is_not_there_is_one_line_naming_what_is(monkeypatch, choice, gpus, needle):
    from p2pfl.errors import UserError
    from p2pfl.runner.assemble import pick_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    with pytest.raises(UserError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        pick_device(choice, 0)


def test_ranks_spread_over_the_gpus_by_local_rank_and_each_becomes_current(monkeypatch):
    """--device cuda (and auto) under mpirun: local rank r on GPU r mod n, made the current device (no
    context on GPU 0 beside it); cuda:N puts every rank on N, so all the local ranks share it."""
    from p2pfl.runner import assemble as simulation
    from p2pfl.runner.fit_checks import ranks_per_gpu

    current = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "8")
    assert [simulation.pick_device("cuda", r).index for r in range(6)] == [0, 1, 2, 3, 0, 1]
    assert simulation.pick_device("auto", 3) == torch.device("cuda", 3) and current[-1] == torch.device("cuda", 3)
    assert simulation.pick_device("cuda:2", 5) == torch.device("cuda", 2)
    assert ranks_per_gpu("cuda") == 2 and ranks_per_gpu("cuda:2") == 8


def test_the_ranks_sharing_a_gpu_are_mpis_own_count_under_any_launcher(monkeypatch):
    """Under srun no Open MPI or MPICH variable says how many ranks share the machine: the shared-memory
    communicator's size (counted by mpi_world) does, so each rank takes its share of a GPU, not half."""
    from p2pfl import comm
    from p2pfl.runner import fit_checks

    for var in ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(comm, "_local_size", None)
    assert fit_checks.ranks_per_gpu("cuda") == 1  # one rank alone
    monkeypatch.setattr(comm, "_local_size", 8)
    assert fit_checks.ranks_per_gpu("cuda") == 4 and fit_checks.ranks_per_gpu("cuda:0") == 8


def test_a_gpu_rank_decides_tf32_where_its_device_is_picked(monkeypatch):
    """IEEE float32 products and convolutions on a GPU unless --tf32 (cuDNN's own default is TF32 for
    convolutions): set once, where the device is picked; the CPU's flags are left alone."""
    from p2pfl.runner.assemble import pick_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        pick_device("cpu", 0)
        assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32
        pick_device("cuda", 0)
        assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
        pick_device("cuda", 0, tf32=True)
        assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_an_unknown_device_name_is_refused_before_any_work():
    result = run_here(*ARGS, "--device", "cuda:x")
    assert result.returncode == 2 and "cuda:x is an unknown device" in result.stderr


def test_peak_gpu_memory_is_summed_over_the_ranks_that_share_a_gpu():
    from p2pfl.measure.facts import busiest_gpu_mib

    assert busiest_gpu_mib([(None, None), (None, None)]) is None  # a CPU run
    assert busiest_gpu_mib([(100.0, "A"), (300.0, "A"), (250.0, "B")]) == 400.0
    assert busiest_gpu_mib([(100.0, "A"), (300.0, "B"), (250.0, "C")]) == 300.0


def test_keyed_draws_are_the_reference_hash_and_each_peers_own():
    """The counter-based draws (minibatch orders, dropout noise) are integer hashes that every device
    computes alike: here checked bit for bit against the hash written in plain Python, and each row's
    draws depend on its key alone (the same whatever other peers share the tensor)."""
    from p2pfl.seeding import derive_seed, keyed_bits, keyed_orders, keyed_uniform, peer_keys

    def mix(h):
        h ^= h >> 16
        h = (h * 0x7FEB352D) & 0xFFFFFFFF
        h ^= h >> 15
        h = (h * 0x846CA68B) & 0xFFFFFFFF
        return h ^ (h >> 16)

    keys = peer_keys(7, "shuffle", 3, list(range(6)))
    bits = keyed_bits(keys[:, None], 5, torch.arange(40)[None])
    for i in range(6):
        for j in range(40):
            assert int(bits[i, j]) & 0xFFFFFFFF == mix(mix((derive_seed(7, "shuffle", 3, i) & 0xFFFFFFFF) ^ 5) ^ j)
    lengths = torch.tensor([40, 13, 1, 0, 27, 40])
    orders = keyed_orders(keys, lengths, 40, 2)
    for i, n in enumerate(lengths.tolist()):
        assert sorted(orders[i, :n].tolist()) == list(range(n)) and orders[i, n:].tolist() == list(range(n, 40))
    assert torch.equal(keyed_orders(keys[1:3], lengths[1:3], 40, 2), orders[1:3])  # a row is its peer's alone
    u = keyed_uniform(keys, 1000, 1, 2)
    assert torch.equal(keyed_uniform(keys[4:], 1000, 1, 2), u[4:]) and 0 <= float(u.min()) and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.02 and not torch.equal(u, keyed_uniform(keys, 1000, 1, 3))
