"""p2pfl beside Flower's simulation engine (flwr with Ray) on one machine, on the same work, as ratios
measured in one run.

The work: FedAvg, Fashion-MNIST, the MLP 784-100-10, 200 samples a client (p2pfl's Dirichlet 0.1
shards, the same for both), 5 local epochs of SGD (lr 0.1, batch 50), every client every round.
Flower's clients train with a plain PyTorch loop on Ray actors (one CPU each); its server evaluates
the aggregated model on the 10,000 test images after each round (its centralized evaluation). p2pfl
runs the same rounds as `python -m p2pfl.run`, once as it comes (its default evaluation: the
aggregated model on every test image and each client's model on the client test subset), and its
training time alone (train_s) is set beside Flower's training (fit) time.

    make bench-flower        # installs the flower extra, then runs this
    python bench/vs_flower.py [--clients 100,300] [--rounds 5]

A round's time is the median over the rounds after the first (Ray's start and the first round's
one-off costs left out on both sides). Each side runs with the other stopped: p2pfl's runs first, before
Ray starts in this process (Ray's processes once took a quarter of a core beside a p2pfl child run after
it, and p2pfl's training read 2.1-2.4 s a round where it takes 0.4 s alone), then Flower's, Ray shut
down after each; the load average is printed beside each side's times.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from bench.common import run_rounds  # noqa: E402
from bench.flower_client import BATCH, EPOCHS, LR, SAMPLES, client_fn, data, get_weights, mlp, set_weights  # noqa: E402


def flower_round_times(clients: int, rounds: int) -> tuple[list[float], list[float]]:
    """(each round's whole time, each round's fit time) of a Flower simulation."""
    from flwr.client import ClientApp
    from flwr.common import Context, ndarrays_to_parameters
    from flwr.server import ServerApp, ServerAppComponents, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.simulation import run_simulation

    marks: dict[str, list[float]] = {"configure": [], "aggregated": [], "evaluated": []}
    ds, _ = data(clients)
    test_model = mlp()

    def evaluate(server_round, parameters, config):
        set_weights(test_model, parameters)
        with torch.no_grad():
            out = test_model(ds.test_x)
        acc = float((out.argmax(1) == ds.test_y).float().mean())
        marks["evaluated"].append(time.perf_counter())
        return float(torch.nn.functional.cross_entropy(out, ds.test_y)), {"acc": acc}

    class TimedFedAvg(FedAvg):
        def configure_fit(self, server_round, parameters, client_manager):
            marks["configure"].append(time.perf_counter())
            return super().configure_fit(server_round, parameters, client_manager)

        def aggregate_fit(self, server_round, results, failures):
            out = super().aggregate_fit(server_round, results, failures)
            marks["aggregated"].append(time.perf_counter())
            return out

    strategy = TimedFedAvg(
        fraction_fit=1.0,
        min_fit_clients=clients,
        min_available_clients=clients,
        fraction_evaluate=0.0,
        evaluate_fn=evaluate,
        initial_parameters=ndarrays_to_parameters(get_weights(mlp())),
    )

    def server_fn(context: Context):
        return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=rounds))

    run_simulation(
        server_app=ServerApp(server_fn=server_fn),
        client_app=ClientApp(client_fn=client_fn),
        num_supernodes=clients,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
    )
    ends = marks["evaluated"][1:]  # [0] is the evaluation of the initial model, before round 1
    whole = [end - start for start, end in zip(marks["configure"], ends)]
    fit = [end - start for start, end in zip(marks["configure"], marks["aggregated"])]
    return whole, fit


def p2pfl_round_times(clients: int, rounds: int) -> tuple[list[float], list[float]]:
    """(each round's round_s, each round's train_s) of `python -m p2pfl.run` on the same work."""
    rows, _ = run_rounds(
        [
            "--algo",
            "fedavg",
            "--peers",
            str(clients),
            "--clients-per-round",
            str(clients),
            "--samples-per-peer",
            str(SAMPLES),
            "--local-epochs",
            str(EPOCHS),
            "--batch-size",
            str(BATCH),
            "--lr",
            str(LR),
            "--rounds",
            str(rounds),
            "--device",
            "cpu",
        ]
    )
    return [r["round_s"] for r in rows], [r["train_s"] for r in rows]


def main() -> None:
    root = str(Path(__file__).resolve().parent.parent)  # Ray's workers import bench.flower_client from here
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", default="100,300")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    try:
        import flwr  # noqa: F401
    except ImportError:
        raise SystemExit(
            "bench/vs_flower.py needs Flower's simulation engine: pip install -e '.[flower]' (or make bench-flower)"
        )
    print(
        "p2pfl beside Flower (flwr + Ray), FedAvg, MLP, 200 samples x 5 epochs a client, all clients a round; "
        "median seconds a round after the first:"
    )
    counts = [int(c) for c in args.clients.split(",")]
    ours = {}
    for clients in counts:  # before Ray starts in this process: nothing of Flower's runs beside them
        load = os.getloadavg()[0]
        ours[clients] = (*p2pfl_round_times(clients, args.rounds), load)
    med = lambda v: statistics.median(v[1:])  # noqa: E731
    for clients in counts:
        load = os.getloadavg()[0]
        f_whole, f_fit = flower_round_times(clients, args.rounds)
        import ray

        ray.shutdown()  # its actors and workers gone before the next side's runs
        p_whole, p_train, p_load = ours[clients]
        print(
            f"  {clients} clients: training: Flower {med(f_fit):.2f} s, p2pfl {med(p_train):.2f} s "
            f"({med(f_fit) / med(p_train):.1f}x); whole round: Flower {med(f_whole):.2f} s (its server's "
            f"evaluation of the aggregated model), p2pfl {med(p_whole):.2f} s (its default evaluation) "
            f"({med(f_whole) / med(p_whole):.1f}x); load average before: p2pfl {p_load:.2f}, Flower {load:.2f}"
        )


if __name__ == "__main__":
    main()
