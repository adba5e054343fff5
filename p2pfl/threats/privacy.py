"""The privacy a DP-SGD run spends, counted by Google's dp-accounting library (its RDP accountant), not
by hand: each peer's steps are Gaussian mechanisms of noise multiplier --dp-noise on minibatches drawn
at rate q = batch / shard, composed over its steps. Like Opacus and TensorFlow Privacy, the accountant
takes each minibatch as Poisson-sampled at rate q; p2pfl draws fixed-size minibatches (and shuffled
epochs under local epochs), for which that is the usual, not a proven, amplification. What a peer sends
is post-processing of its noised gradients, so the epsilon covers every message it sends (local DP of
the messages); a peer that was offline in a round is counted as if it had stepped (an upper bound)."""

from __future__ import annotations

import functools
import logging

from p2pfl.errors import UserError


@functools.lru_cache(maxsize=4096)
def epsilon(sampling: float, noise: float, steps: int, delta: float) -> float:
    """epsilon at delta after steps Poisson-sampled Gaussian steps (dp_accounting.rdp.RdpAccountant)."""
    try:
        from dp_accounting import dp_event, rdp
    except ImportError:
        raise UserError("--dp-clip counts privacy with the dp-accounting package: pip install dp-accounting") from None
    if steps == 0:
        return 0.0
    absl = logging.getLogger("absl")  # its notes on orders it leaves out of the bound (still a bound) are not ours
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        accountant = rdp.RdpAccountant()
        accountant.compose(dp_event.PoissonSampledDpEvent(sampling, dp_event.GaussianDpEvent(noise)), steps)
        return float(accountant.get_epsilon(delta))
    finally:
        absl.setLevel(level)


class PrivacyLedger:
    """Each peer's sampling rate and DP steps a round, and the epsilon they have spent after k rounds."""

    def __init__(self, sampling: list[float], steps_per_round: list[int], noise: float, delta: float, counted):
        self.sampling, self.steps, self.noise, self.delta = sampling, steps_per_round, noise, delta
        self.counted = list(counted)  # the peers whose privacy a row states (the honest ones)

    def spent(self, rounds: int) -> list[float]:
        """Every peer's epsilon after rounds rounds, in peer order."""
        return [epsilon(q, self.noise, s * rounds, self.delta) for q, s in zip(self.sampling, self.steps)]

    def row(self, rounds: int) -> dict:
        """A row's dp_epsilon: the largest of the counted peers'."""
        spent = self.spent(rounds)
        return {"dp_epsilon": float(f"{max(spent[p] for p in self.counted):.6g}")}

    def final(self, rounds: int) -> dict:
        """final.json's: the largest epsilon, delta, and every peer's where they differ."""
        spent = [float(f"{e:.6g}") for e in self.spent(rounds)]
        out = {"dp_epsilon": max(spent[p] for p in self.counted), "dp_delta": self.delta}
        if len({spent[p] for p in self.counted}) > 1:
            out["dp_epsilon_per_peer"] = spent
        return out
