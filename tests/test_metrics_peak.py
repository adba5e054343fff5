"""peak_rss_mb is the run's own memory, not that of the process that started it."""

import resource
import subprocess
import sys

import pytest

from p2pfl.measure.facts import peak_rss_kib

CHILD = "from p2pfl.measure.facts import peak_rss_kib; print(peak_rss_kib())"


@pytest.mark.subprocess
def test_a_child_does_not_report_its_parents_peak_memory():
    big = bytearray(1536 * 2**20)  # 1.5 GiB held by this process while it starts the child
    big[::4096] = b"\1" * len(big[::4096])
    parent_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    child_kib = int(subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True).stdout)
    del big
    assert parent_kib > 1536 * 1024
    # ru_maxrss would report at least the parent's peak here (exec keeps it on Linux); the child itself
    # holds torch and numpy, well under the 1.5 GiB buffer
    assert child_kib < 1024 * 1024 < parent_kib


def test_peak_memory_covers_what_this_process_holds():
    before = peak_rss_kib()
    block = bytearray(256 * 2**20)
    block[::4096] = b"\1" * len(block[::4096])
    assert peak_rss_kib() >= before and peak_rss_kib() >= 256 * 1024


@pytest.mark.filterwarnings("ignore::FutureWarning")  # gc.get_objects() meets torch.distributed.reduce_op
def test_nothing_accumulates_over_rounds_but_the_rows(tmp_path, monkeypatch):
    """Between round 10 and round 60 of one run (checkpoints every round, the held captures SIGTERM
    saves, TensorBoard, the edges file, evaluation every round): no tensor is left alive, and Python's
    memory grows by the rows' size at most (tracemalloc: Python's allocations, the rows, captures' lists;
    the tensor count stands for torch's own)."""
    import gc
    import json
    import tracemalloc

    import torch

    from p2pfl.runner import round_row as measure
    from p2pfl.testing import run_in_process

    seen, real = {}, measure.RoundMeasure.record

    def record(self, k, *args):
        row = real(self, k, *args)
        if k in (9, 59):
            gc.collect()
            tensors = sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))
            seen[k] = (tensors, tracemalloc.get_traced_memory()[0], len(json.dumps(self.log.rows)))
        return row

    monkeypatch.setattr(measure.RoundMeasure, "record", record)
    tracemalloc.start()
    try:
        done = run_in_process(
            [
                "--dataset",
                "synthetic",
                "--peers",
                "8",
                "--kappa",
                "3",
                "--rounds",
                "60",
                "--local-epochs",
                "1",
                "--samples-per-peer",
                "30",
                "--checkpoint-every",
                "1",
                "--tensorboard",
                "--save-edges",
                "--no-progress",
                "--out",
                str(tmp_path / "run"),
            ]
        )
    finally:
        tracemalloc.stop()
    assert done.returncode == 0, done.stderr[-2000:]
    (tensors10, python10, rows10), (tensors60, python60, rows60) = seen[9], seen[59]
    assert tensors60 == tensors10, (tensors10, tensors60)
    assert python60 - python10 < 2 * (rows60 - rows10) + 256 * 1024, (python10, python60, rows60 - rows10)


def test_the_inter_model_variance_from_sums_in_row_blocks_is_the_whole_matrixs(monkeypatch):
    """Summed a block of peers at a time (its float64 copies bounded), eq. (6) and the consensus distance
    are the numbers of the whole matrix."""
    import torch

    from p2pfl.measure import facts as round_facts
    from p2pfl.runner import round_row as measure

    w = torch.randn(40, 3001, generator=torch.Generator().manual_seed(1)) * 0.1
    whole = float((torch.var(w.double(), dim=0, correction=0) * len(w)).sqrt().mean())
    distance = float(((w.double() - w.double().mean(0)) ** 2).sum(1).mean())
    for block in (measure.ROW_BLOCK, 3001 * 7):  # the last block of 7 rows shorter
        monkeypatch.setattr(measure, "ROW_BLOCK", block)
        mean = measure.sum_rows(w) / len(w)
        deviations = measure.squared_deviations(w, mean)
        assert round_facts.inter_model_variance(deviations) == pytest.approx(whole, rel=1e-9)
        assert round_facts.consensus_distance(float(deviations.sum()), len(w)) == pytest.approx(distance, rel=1e-9)
        a = torch.rand(40, generator=torch.Generator().manual_seed(2))
        assert torch.allclose(measure.sum_rows(w, a), (a[:, None].double() * w.double()).sum(0))
