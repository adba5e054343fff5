"""p2pfl: a decentralized peer-to-peer learning simulator on a graph.

    import p2pfl
    result = p2pfl.simulate(algo="dfedavg", peers=10, rounds=5, dataset="synthetic")

The public names below are loaded on first use, so that `python -m p2pfl.run` can size its thread pools
before torch starts (p2pfl.threads). docs/library.md describes them; docs/design.md has the Algorithm
contract a new algorithm follows.
"""

import importlib
import os
import sys

# numpy's BLAS on one thread, set before numpy starts it: its results depend on its thread count, and a
# run must give the same numbers alone or under mpirun; NTK evolutions run one per thread instead
# (p2pfl.ntk.step).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
if "numpy" in sys.modules:  # numpy (or torch, which imports it) came first: its BLAS has its threads already
    from threadpoolctl import threadpool_limits

    threadpool_limits(1, user_api="blas")

__version__ = "0.3.0"

_PUBLIC = {
    "simulate": "p2pfl.runner.simulation",
    "Result": "p2pfl.runner.simulation",  # running
    "ConfigError": "p2pfl.errors",
    "DivergenceError": "p2pfl.errors",
    "Interrupted": "p2pfl.errors",
    "Algorithm": "p2pfl.algorithms.base",
    "Round": "p2pfl.algorithms.base",  # writing an algorithm
    "RunContext": "p2pfl.algorithms.context",
    "neighbour_average": "p2pfl.algorithms.base",
    "GossipSettings": "p2pfl.gossip.codec_settings",
    "gossip_codec": "p2pfl.gossip.codec_settings",
    "GossipCodec": "p2pfl.gossip.codecs",
    "ServerAlgorithm": "p2pfl.algorithms.server",
    "ServerOptions": "p2pfl.algorithms.server",
    "ClientWork": "p2pfl.algorithms.server",
    "declare_metric": "p2pfl.measure.metrics",  # a metric of one's own
    "Message": "p2pfl.comm",
    "Payload": "p2pfl.comm",
    "Weights": "p2pfl.comm",
    "option": "p2pfl.settings.fields",
    "positive": "p2pfl.settings.fields",
    "non_negative": "p2pfl.settings.fields",
    "fraction": "p2pfl.settings.fields",
    "at_least": "p2pfl.settings.fields",
    "probability": "p2pfl.settings.fields",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'p2pfl' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_PUBLIC])
