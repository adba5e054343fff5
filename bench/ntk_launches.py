"""How many device operations an NTK-DFL round issues on a GPU's path, counted on the CPU: the host's cost of
a GPU round grows with them (8-12 us of Python and launch each), not with the arithmetic.

The GPU's choices are forced on the CPU (p2pfl.testing.gpu_path_on_the_cpu): the evolutions as one batch,
no 8-bit pixel codes (the CPU's integer products; a GPU takes float Grams), the mixing as stacked products;
and the free memory of the GPU stood for (--gpu-gib, an H200's by default), which sizes the chunks of peers
evolved together. Every operation torch dispatches is counted (TorchDispatchMode), except the views and
reshapes that launch nothing; a tensor read back as one Python number (item(), each a wait on a GPU) is
counted apart. Reads of whole tensors (tolist, cpu) are not seen on the CPU: the batched step makes three
a chunk by design (the kernels' Ritz values, which are finite, the chosen t's). Printed per round: all
operations, those inside the batched evolution, how many times its integration loop ran, the operations
per peer outside it, and the item() reads.

    python bench/ntk_launches.py [--peers 300] [--samples 200] [--rounds 2] [--gpu-gib 139] [--where] [--json FILE]

The default is the paper preset (p2pfl/presets/ntk-dfl-fmnist300.toml); round 2 is a trained round.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
import traceback
from contextlib import ExitStack, contextmanager
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import p2pfl  # noqa: E402,F401  (first: numpy's BLAS on one thread)
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from p2pfl.runner.assemble import build  # noqa: E402
from p2pfl.runner.configure import load_toml, make_config, resolve  # noqa: E402
from p2pfl.models.stack import PeerStack  # noqa: E402
from p2pfl.ntk import batched_evolution  # noqa: E402
from p2pfl.testing import gpu_path_on_the_cpu  # noqa: E402

PRESET = ROOT / "p2pfl/presets/ntk-dfl-fmnist300.toml"
NO_LAUNCH = {"aten._unsafe_view.default", "aten.detach.default", "aten.lift_fresh.default", "aten.alias.default"}
SYNC = "aten._local_scalar_dense.default"


class Counter(TorchDispatchMode):
    """Operations dispatched, inside the batched evolution and outside it, and host syncs."""

    def __init__(self, where: bool = False):
        super().__init__()
        self.inside_evolution, self.where = 0, where
        self.reset()

    def reset(self) -> None:
        self.ops = self.inside = self.syncs = self.loops = 0
        self.sites: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if name == SYNC:
            self.syncs += 1
        elif not func.is_view and name not in NO_LAUNCH:
            self.ops += 1
            self.inside += bool(self.inside_evolution)
            if self.where and not self.inside_evolution:
                frames = [f for f in traceback.extract_stack(limit=30) if "/p2pfl/" in f.filename]
                self.sites[" < ".join(f"{Path(f.filename).name}:{f.name}" for f in frames[-3:][::-1])] += 1
        return func(*args, **(kwargs or {}))


@contextmanager
def gpu_choices_on_the_cpu(counter: Counter, gpu_bytes: int):
    """The GPU's code paths taken on the CPU (and its free memory), and the batched evolution's calls counted."""
    evolve, integrate = batched_evolution.evolve_padded, batched_evolution._integrate

    def evolution(*a, **k):
        counter.inside_evolution += 1
        try:
            return evolve(*a, **k)
        finally:
            counter.inside_evolution -= 1

    def loop(*a, **k):
        counter.loops += 1
        return integrate(*a, **k)

    with ExitStack() as patches:
        patches.enter_context(gpu_path_on_the_cpu())
        for where, name, value in (
            (PeerStack, "batch_budget", lambda stack: int(gpu_bytes * stack.memory_share)),
            (batched_evolution, "evolve_padded", evolution),
            (batched_evolution, "_integrate", loop),
        ):
            patches.enter_context(mock.patch.object(where, name, value))
        yield


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peers", type=int, default=300)
    p.add_argument("--samples", type=int, help="samples per peer (default the preset's 200)")
    p.add_argument("--rounds", type=int, default=2, help="rounds counted (round 2 on: trained)")
    p.add_argument("--dataset", help="another dataset (default the preset's Fashion-MNIST)")
    p.add_argument("--gpu-gib", type=float, default=139.0, help="free memory of the GPU stood for (an H200's)")
    p.add_argument("--where", action="store_true", help="also the call sites of the operations outside the evolution")
    p.add_argument("--json", help="also write the counts to this file")
    a = p.parse_args()
    values = {k.replace("-", "_"): v for k, v in load_toml(str(PRESET)).items()}
    values.pop("rounds")
    values.update(peers=a.peers, progress=False, device="cpu")
    if a.samples:
        values["samples_per_peer"] = a.samples
    if a.dataset:
        values["dataset"] = a.dataset
    counter = Counter(a.where)
    rows = []
    with gpu_choices_on_the_cpu(counter, int(a.gpu_gib * 2**30)):
        ctx, algorithm = build(resolve(make_config(values), 1), 0, 1, 0)
        print(
            f"NTK-DFL, {a.peers} peers x {values['samples_per_peer']} samples, the GPU's path forced on the CPU "
            f"(evolutions chunked {algorithm.plan.chunk} peers at a time)"
        )
        for k in range(a.rounds):
            counter.reset()
            start = time.perf_counter()
            with counter:
                algorithm.round(k)
            outside = counter.ops - counter.inside
            row = {
                "round": k + 1,
                "ops": counter.ops,
                "evolution_ops": counter.inside,
                "integration_loops": counter.loops,
                "outside_per_peer": round(outside / a.peers, 1),
                "item_reads": counter.syncs,
                "seconds": round(time.perf_counter() - start, 1),
            }
            rows.append(row)
            print(
                f"  round {k + 1}: {counter.ops:,} operations, {counter.inside:,} in the batched evolution "
                f"({counter.loops} integration loop{'s' * (counter.loops != 1)}), {outside / a.peers:.1f} per peer "
                f"outside it, {counter.syncs} item() reads ({row['seconds']} s on this CPU)"
            )
            for site, n in counter.sites.most_common(25):
                print(f"      {n / a.peers:7.1f} per peer  {site}")
    if a.json:
        Path(a.json).write_text(json.dumps({"peers": a.peers, "rounds": rows}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
