"""The privacy a DP-SGD run spends, counted by Google's dp-accounting library (its RDP accountant), not
by hand: each peer's steps are Gaussian mechanisms of noise multiplier --dp-noise on minibatches drawn
at rate q = batch / shard, composed over its steps. Like Opacus and TensorFlow Privacy, the accountant
takes each minibatch as Poisson-sampled at rate q; p2pfl draws fixed-size minibatches (and shuffled
epochs under local epochs), for which that is the usual, not a proven, amplification. What a peer sends
is post-processing of its noised gradients, so the epsilon covers every message it sends (local DP of
the messages); a peer that was offline in a round is counted as if it had stepped (an upper bound).

Pairwise network DP (Muffliato, Cyffers, Even, Bellet and Massoulié, NeurIPS 2022) states what one peer v
learns of peer u from the messages v itself receives. After a noised step, K gossip steps of W send
x^t = W^t x for t < K; v hears x^t_w from each of its neighbours w, in which u's noise has the share
(W^t)_wu^2 / ||row w of W^t||^2 of the noise's variance. The paper's bound for gossip averaging sums these
shares into the exposure S_uv, so that each of u's steps is, to v, a Gaussian mechanism of noise multiplier
--dp-noise / sqrt(S_uv); dp-accounting composes it as above (S_uv = 1 is local DP, 0 nothing)."""

from __future__ import annotations

import contextlib
import functools
import logging
import math

import numpy as np

from p2pfl.errors import UserError


@contextlib.contextmanager
def _accountant():
    """dp-accounting's modules, its absl notes (on orders it leaves out of a bound, still a bound) silenced."""
    try:
        from dp_accounting import dp_event, rdp
    except ImportError:
        raise UserError("--dp-clip counts privacy with the dp-accounting package: pip install dp-accounting") from None
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        yield dp_event, rdp
    finally:
        absl.setLevel(level)


@functools.lru_cache(maxsize=None)
def _one_step(sampling: float, noise: float):
    """The RDP curve of one Poisson-sampled Gaussian step, as the accountant composes it (its orders, values),
    computed once per (sampling, noise): about 30 ms each."""
    with _accountant() as (dp_event, rdp):
        accountant = rdp.RdpAccountant()
        accountant.compose(dp_event.PoissonSampledDpEvent(sampling, dp_event.GaussianDpEvent(noise)))
        return accountant.orders, accountant.rdp


@functools.lru_cache(maxsize=4096)
def epsilon(sampling: float, noise: float, steps: int, delta: float) -> float:
    """epsilon at delta after steps Poisson-sampled Gaussian steps: one step's RDP curve times steps, as
    dp_accounting's RdpAccountant.compose counts equal steps, read by its compute_epsilon."""
    if steps == 0:
        return 0.0
    orders, per_step = _one_step(sampling, noise)
    with _accountant() as (_, rdp):
        return float(rdp.rdp_privacy_accountant.compute_epsilon(orders, per_step * steps, delta)[0])


def rounded_up(exposure: float, digits: int = 4) -> float:
    """exposure to digits significant digits, upwards (fewer distinct curves to compute; epsilon only grows)."""
    scale = 10.0 ** (math.floor(math.log10(exposure)) - digits + 1)
    return math.ceil(exposure / scale - 1e-9) * scale


def pairwise_epsilon(sampling: float, noise: float, exposure: float, steps: int, delta: float) -> float:
    """epsilon at delta of u to v: steps of u's Poisson-sampled Gaussian steps, each of noise multiplier
    noise / sqrt(exposure) as v sees it (exposure rounded up to 4 digits)."""
    if steps == 0 or exposure <= 0:
        return 0.0
    return epsilon(sampling, noise / math.sqrt(rounded_up(exposure)), steps, delta)


def exposure(mixing: np.ndarray, steps: int, heard: list[list[int]]) -> np.ndarray:
    """S[u, v]: the shares of u's noise in what v hears over steps gossip steps of mixing (Muffliato's
    averaging bound): the sum over t < steps and v's neighbours w != v of (W^t)_wu^2 / ||row w of W^t||^2.
    heard[v]: the peers v hears. The diagonal is 0 (a peer's own privacy is not in question)."""
    n = len(mixing)
    listens = np.zeros((n, n))
    for v, senders in enumerate(heard):
        listens[v, [w for w in senders if w != v]] = 1.0
    out = np.zeros((n, n))
    power = np.eye(n)
    for _ in range(steps):
        squared = power**2
        out += (listens @ (squared / squared.sum(axis=1, keepdims=True))).T
        power = mixing @ power
    np.fill_diagonal(out, 0.0)
    return out


class PrivacyLedger:
    """Each peer's sampling rate and DP steps a round, and the epsilon they have spent after k rounds;
    with exposure (S[u, v], above), also the pairwise network epsilon of each honest peer to every other."""

    def __init__(
        self,
        sampling: list[float],
        steps_per_round: list[int],
        noise: float,
        delta: float,
        counted,
        exposure: np.ndarray | None = None,
    ):
        self.sampling, self.steps, self.noise, self.delta = sampling, steps_per_round, noise, delta
        self.counted = list(counted)  # the peers whose privacy a row states (the honest ones)
        self.exposure = exposure

    def spent(self, rounds: int) -> list[float]:
        """Every peer's epsilon after rounds rounds, in peer order."""
        return [epsilon(q, self.noise, s * rounds, self.delta) for q, s in zip(self.sampling, self.steps)]

    def pairwise(self, rounds: int) -> np.ndarray:
        """eps[i, v]: the epsilon of the i-th counted peer to peer v after rounds rounds (0 where v is itself)."""
        out = np.zeros((len(self.counted), len(self.sampling)))
        for i, u in enumerate(self.counted):
            for v, share in enumerate(self.exposure[u]):
                if v != u:
                    out[i, v] = pairwise_epsilon(
                        self.sampling[u], self.noise, share, self.steps[u] * rounds, self.delta
                    )
        return out

    def _network(self, rounds: int) -> tuple[np.ndarray, np.ndarray]:
        """Each counted peer's mean epsilon to the other peers, and the matrix they come from."""
        pairs = self.pairwise(rounds)
        others = len(self.sampling) - 1
        return pairs.sum(axis=1) / max(others, 1), pairs

    def row(self, rounds: int) -> dict:
        """A row's dp_epsilon, the largest of the counted peers'; with an exposure, dp_epsilon_network, the
        mean over the ordered pairs of a counted peer and another."""
        spent = self.spent(rounds)
        out = {"dp_epsilon": float(f"{max(spent[p] for p in self.counted):.6g}")}
        if self.exposure is not None:
            out["dp_epsilon_network"] = float(f"{self._network(rounds)[0].mean():.6g}")
        return out

    def final(self, rounds: int) -> dict:
        """final.json's: the largest epsilon, delta, and every peer's where they differ; with an exposure, the
        pairs' mean and largest network epsilon and each counted peer's mean where they differ."""
        spent = [float(f"{e:.6g}") for e in self.spent(rounds)]
        out = {"dp_epsilon": max(spent[p] for p in self.counted), "dp_delta": self.delta}
        if len({spent[p] for p in self.counted}) > 1:
            out["dp_epsilon_per_peer"] = spent
        if self.exposure is not None:
            means, pairs = self._network(rounds)
            out["dp_epsilon_network"] = float(f"{means.mean():.6g}")
            out["dp_epsilon_network_max"] = float(f"{pairs.max():.6g}")
            per_peer = [float(f"{m:.6g}") for m in means]
            if len(set(per_peer)) > 1:
                out["dp_epsilon_network_per_peer"] = dict(zip(map(str, self.counted), per_peer))
        return out
