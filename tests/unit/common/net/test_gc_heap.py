"""The serving processes' garbage-collector set-up: start-up objects frozen out of the scans, and the
collections that still run counted."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

import pytest

from common.net.gc_heap import GcPauseMeter, freeze_startup_heap

# Run in a child process: freezing the test process's heap would keep every later test's garbage
# alive whenever it hangs off an object alive now.
_FREEZE_CHILD = textwrap.dedent(
    """
    import gc, time
    from common.net.gc_heap import freeze_startup_heap
    heap = [[i] for i in range(200_000)]  # long-lived tracked objects, as a loaded model's modules
    cycle = [None]; cycle[0] = cycle; del cycle  # start-up garbage: collected, not frozen
    t = time.perf_counter(); gc.collect(); before = time.perf_counter() - t
    frozen = freeze_startup_heap(young_threshold=5_000)
    t = time.perf_counter(); gc.collect(); after = time.perf_counter() - t
    print(frozen >= len(heap), gc.get_threshold(), after < before / 5, gc.collect() == 0)
    """
)


def test_freezing_takes_the_start_up_heap_out_of_full_collections():
    out = subprocess.run(
        [sys.executable, "-c", _FREEZE_CHILD], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split("\n")[0]
    assert out == "True (5000, 20, 100) True True"


def test_young_threshold_is_checked_before_anything_is_frozen():
    frozen = gc.get_freeze_count()
    with pytest.raises(ValueError, match="young_threshold"):
        freeze_startup_heap(young_threshold=0)
    assert gc.get_freeze_count() == frozen


def test_the_meter_counts_collections_while_installed_and_restarts_on_take():
    meter = GcPauseMeter()
    meter.install()
    meter.install()  # once only: each collection counts once
    try:
        gc.collect(0)
        gc.collect(1)
        gc.collect(2)
    finally:
        meter.uninstall()
    pauses = meter.take()
    assert (pauses.collections, pauses.full_collections) == (3, 1)
    assert 0 < pauses.max_s <= pauses.total_s
    gc.collect()  # uninstalled: not counted
    assert meter.take().collections == 0
    assert meter._on_gc not in gc.callbacks
