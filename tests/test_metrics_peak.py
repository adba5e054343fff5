"""peak_rss_mb is the run's own memory, not that of the process that started it."""
import resource
import subprocess
import sys

import pytest

from p2pfl.metrics import peak_rss_kib

CHILD = "from p2pfl.metrics import peak_rss_kib; print(peak_rss_kib())"


@pytest.mark.subprocess
def test_a_child_does_not_report_its_parents_peak_memory():
    big = bytearray(1536 * 2**20)  # 1.5 GiB held by this process while it starts the child
    big[::4096] = b"\1" * len(big[::4096])
    parent_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    child_kib = int(subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                                   check=True).stdout)
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
