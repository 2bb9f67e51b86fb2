"""glibc's malloc thresholds, set when `reverb` is imported: big buffers filled and freed
over and over on a thread (a dataset's batches) must not fault their pages in afresh each
time."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

# Three 3 MiB buffers filled and freed per round on a thread: freed together they leave more
# free space at the top of the thread's arena than glibc's own trim threshold allows, so an
# untuned arena gives it back and the next round faults every page in again.
CHURN = """
import json, resource, threading
import numpy as np
import reverb._native as native

faults = []

def churn(rounds):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(rounds):
        buffers = [np.empty(3 << 20, np.uint8) for _ in range(3)]
        for b in buffers:
            b.fill(1)
        del buffers, b
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)

thread = threading.Thread(target=churn, args=(100,))
thread.start()
thread.join()
print(json.dumps({"tuned": native._malloc_tuned(), "faults": faults[0]}))
"""

PAGES_PER_ROUND = 3 * (3 << 20) // os.sysconf("SC_PAGE_SIZE")


def churn(**env: str) -> dict:
    """Runs CHURN in a fresh process whose environment has no malloc settings but `env`."""
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", "REVERB_MALLOC_TUNING")
    }
    out = subprocess.run(
        [sys.executable, "-c", CHURN],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def huge_pages_always() -> bool:
    """Whether transparent huge pages back every anonymous mapping (then a refault is one
    fault per 2 MiB and the control's count collapses)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[always]" in f.read()
    except OSError:
        return False


GLIBC_64 = (
    sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc" and sys.maxsize > 2**32
)


@pytest.mark.skipif(not GLIBC_64, reason="64-bit glibc only")
def test_big_buffers_are_not_faulted_in_again_each_round():
    tuned = churn()
    assert tuned["tuned"] is True
    # Only the first round touches fresh pages (and not even that, when the arena had them).
    assert tuned["faults"] < 10 * PAGES_PER_ROUND, tuned
    untuned = churn(REVERB_MALLOC_TUNING="0")
    assert untuned["tuned"] is False
    if not huge_pages_always():
        # The control: without the thresholds, every round faults its pages in again.
        assert untuned["faults"] > 50 * PAGES_PER_ROUND, untuned


def test_the_users_own_malloc_settings_win():
    assert churn(GLIBC_TUNABLES="glibc.malloc.trim_threshold=131072")["tuned"] is False
    assert churn(MALLOC_MMAP_THRESHOLD_="131072")["tuned"] is False
    assert churn(REVERB_MALLOC_TUNING="off")["tuned"] is False
