"""A run's parts on this rank, built once: the device, the data and its partition, the model and its
peers' parameters, the transport and its simulated faults, the topology, and the algorithm."""

from __future__ import annotations

from contextlib import contextmanager

import torch

from p2pfl.plugins import call_hook
from p2pfl.algorithms.context import RunContext
from p2pfl.comm import make_transport, ranks_sharing_this_machine
from p2pfl.runner.fit_checks import check_data_fit, check_model_memory, gpu_share, ranks_per_gpu
from p2pfl.settings.run_config import RunConfig
from p2pfl.data import DataRequest, load_dataset, partition, read_partition_file
from p2pfl.errors import OutOfGPUMemory, UserError
from p2pfl.comm.availability import Availability, read_availability
from p2pfl.comm.clock import Network, peer_step_times, read_step_times
from p2pfl.models.flops import step_flops
from p2pfl.comm.faults import Faults
from p2pfl.models import PeerStack, build_model, count_parameters, initial_parameters
from p2pfl.runner.graph_schedule import schedule_of
from p2pfl.tasks import TASKS
from p2pfl.threats import threats_of


def pick_device(choice: str, local_rank: int, tf32: bool = False) -> torch.device:
    """The rank's device, decided once: auto is a GPU where there is one, else the CPU; auto and cuda
    spread the ranks of a machine over its GPUs by local rank; cuda:N is that GPU for every rank. A GPU
    becomes the process's current device, so that no library opens a context on GPU 0 beside it, and its
    numerics are set here: IEEE float32 matrix products and convolutions unless tf32 (cuDNN's default
    would compute every convolution in TF32 while matrix products stay float32)."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if choice == "auto":
        choice = "cuda" if gpus else "cpu"
    if choice == "cpu":
        return torch.device("cpu")
    if not gpus:
        raise UserError(
            f"--device {choice}: no CUDA device is available here (torch {torch.__version__} sees "
            "none); use --device cpu or auto"
        )
    index = local_rank % gpus if choice == "cuda" else int(choice.split(":", 1)[1])
    if index >= gpus:
        raise UserError(
            f"--device {choice}: this machine has {gpus} GPU{'s' if gpus > 1 else ''} "
            f"(cuda:0{f' to cuda:{gpus - 1}' if gpus > 1 else ''})"
        )
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    set_tf32(tf32)
    return device


def set_tf32(allowed: bool) -> None:
    """Whether a GPU's float32 matrix products and convolutions may round their inputs to TF32."""
    torch.backends.cuda.matmul.allow_tf32 = allowed
    torch.backends.cudnn.allow_tf32 = allowed


def build(cfg: RunConfig, rank: int, size: int, local_rank: int):
    """Everything a round needs, for this rank's peers."""
    device = pick_device(cfg.device, local_rank, cfg.tf32)
    cls = cfg.algorithm
    data = load_dataset(cfg.dataset, DataRequest(cfg.data_dir, cfg.labels, cfg.peers, cfg.samples_per_peer, cfg.seed))
    if cfg.train_samples:
        data.keep_training_samples(cfg.train_samples, cfg.seed)
    # a partition file's indices name samples of the training set as loaded, before the algorithm drops
    # any (FedAvg-FT's held-out classes): checked against that count, then mapped to the samples kept
    loaded = len(data.train_y)
    call_hook(cls, "prepare_data", data, cfg)
    check_data_fit(cfg, len(data.train_y), len(data.test_y), data.train_x[0].numel())  # the data it trains on
    if cfg.partition_file:
        shards = read_partition_file(cfg.partition_file, cfg.peers, loaded, data.train_origin)
    else:
        shards = partition(
            data.train_y.numpy(),
            data.train_classes,
            cfg.peers,
            cfg.partition,
            per_peer=cfg.samples_per_peer,
            alpha=cfg.alpha,
            classes=cfg.classes_per_peer,
            style=cfg.dirichlet_style,
            classes_style=cfg.classes_style,
            groups=data.groups,
            seed=cfg.seed,
        )
    threats = threats_of(cfg, cfg.peers)
    if threats is not None and threats.poisons_labels:  # the attackers train on flipped labels
        shards = threats.poison(data, shards)
    transport = make_transport(cfg.peers, 1 if cls.centralized else 0, cfg.comm_timeout, device)
    faults = Faults(
        cfg.seed,
        cfg.peers,
        cfg.drop_peers,
        cfg.drop_links,
        cfg.slow_peers,
        cfg.slow_factor,
        cfg.round_deadline,
        availability_of(cfg),
    )
    transport.faults = faults if faults.active else None
    peers = transport.placement.peers_of(transport.rank)
    with torch.device("meta"):  # counted before it is allocated
        n_params = count_parameters(build_model(cfg.model, data.input_shape, data.n_classes, cfg))
    check_model_memory(
        cfg, n_params, len(peers) * ranks_sharing_this_machine(), gpu_share(device, cfg.device, len(peers))
    )
    model = build_model(cfg.model, data.input_shape, data.n_classes, cfg)
    flat = initial_parameters(model, peers, cfg.seed, cfg.init, device)
    data.to(device)
    stack = PeerStack(model.to(device), cfg.batch, TASKS[data.task])
    if device.type == "cuda":  # the ranks that share a GPU share its free memory for their batches
        stack.memory_share /= ranks_per_gpu(cfg.device)
    ctx = RunContext(
        cfg=cfg,
        transport=transport,
        data=data,
        shards=[torch.from_numpy(s) for s in shards],
        schedule=schedule_of(cfg, cfg.peers + cls.centralized),
        stack=stack,
        peers=peers,
        flat=flat,
        device=device,
        faults=transport.faults,
        network=network_of(cfg, lambda: step_flops(model, data.input_shape, cfg.batch_size)),
        threats=threats,
    )
    return ctx, call_hook(cls, "__init__", ctx)


@contextmanager
def gpu_memory_in_one_line(cfg: RunConfig, size: int, local_rank: int):
    """Running out of GPU memory inside is OutOfGPUMemory's one line saying what to change, not a CUDA
    traceback."""
    try:
        yield
    except torch.OutOfMemoryError:
        raise out_of_gpu_memory(cfg, size, str(pick_device(cfg.device, local_rank))) from None


def out_of_gpu_memory(cfg: RunConfig, size: int, device: str) -> OutOfGPUMemory:
    per_rank = -(-cfg.peers // size)
    if device.startswith("cuda"):
        device += f" ({torch.cuda.get_device_properties(torch.device(device)).total_memory / 2**30:.0f} GiB)"
    return OutOfGPUMemory(
        f"out of GPU memory on {device} with {per_rank} peers on a rank: use fewer peers per "
        f"rank (more ranks: mpirun -n, or fewer --peers), fewer samples (--samples-per-peer, --train-samples, "
        f"--test-samples), a smaller model (--model, --hidden), or --device cpu"
    )


def availability_of(cfg: RunConfig) -> Availability | None:
    """Peers that leave and come back, from --availability-file or --churn (None: every peer stays)."""
    if cfg.availability_file:
        return read_availability(cfg.availability_file, cfg.peers)
    if cfg.churn > 0:
        return Availability.seeded(cfg.seed, cfg.peers, cfg.churn, cfg.churn_online, cfg.churn_offline)
    return None


def network_of(cfg: RunConfig, flops=None) -> Network:
    """The virtual clock's network and system model from the run's flags (p2pfl.comm.clock); flops() counts
    the model's FLOPs a step, where --peer-flops sets the step time from it."""
    step_time = cfg.step_time if cfg.peer_flops is None else flops() / cfg.peer_flops
    if cfg.step_time_file:
        steps = read_step_times(cfg.step_time_file, cfg.peers)
    elif step_time is not None:
        steps = peer_step_times(cfg.seed, cfg.peers, step_time, cfg.step_time_spread, cfg.slower_peers, cfg.slower_by)
    else:
        steps = None
    return Network(cfg.seed, steps, cfg.link_latency, cfg.link_bandwidth, cfg.link_spread)
