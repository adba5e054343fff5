"""Flower's side of bench/vs_flower.py: a client that trains the MLP with a plain PyTorch loop on its
p2pfl shard. A module of its own so that Ray's actors import it by name (and build the data once per
actor) instead of receiving the data with every client."""

from __future__ import annotations

import numpy as np
import torch

EPOCHS, BATCH, LR, SAMPLES = 5, 50, 0.1, 200
_SHARDS: dict[int, tuple] = {}


def data(clients: int):
    """Fashion-MNIST and each client's shard of it (p2pfl's Dirichlet 0.1 draw for seed 0), once per process."""
    if clients not in _SHARDS:
        from p2pfl.data import load_dataset, partition

        ds = load_dataset("fashion-mnist")
        shards = partition(ds.train_y.numpy(), ds.n_classes, clients, "dirichlet", per_peer=SAMPLES, alpha=0.1, seed=0)
        _SHARDS[clients] = (ds, [(ds.train_x[torch.as_tensor(s)], ds.train_y[torch.as_tensor(s)]) for s in shards])
    return _SHARDS[clients]


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 100), torch.nn.ReLU(), torch.nn.Linear(100, 10))


def get_weights(model) -> list[np.ndarray]:
    return [v.detach().cpu().numpy() for v in model.state_dict().values()]


def set_weights(model, weights) -> None:
    model.load_state_dict({k: torch.from_numpy(np.asarray(w)) for k, w in zip(model.state_dict(), weights)})


def client_fn(context):
    from flwr.client import NumPyClient

    class Client(NumPyClient):
        def __init__(self, index: int, clients: int):
            (self.x, self.y), self.model = data(clients)[1][index], mlp()

        def fit(self, parameters, config):
            torch.set_num_threads(1)
            set_weights(self.model, parameters)
            opt = torch.optim.SGD(self.model.parameters(), lr=LR)
            loss_fn = torch.nn.CrossEntropyLoss()
            for _ in range(EPOCHS):
                order = torch.randperm(len(self.y))
                for start in range(0, len(order), BATCH):
                    b = order[start : start + BATCH]
                    opt.zero_grad()
                    loss_fn(self.model(self.x[b]), self.y[b]).backward()
                    opt.step()
            return get_weights(self.model), len(self.y), {}

    return Client(int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])).to_client()
