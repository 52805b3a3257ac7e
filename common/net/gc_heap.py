"""The cyclic garbage collector in the long-running serving processes (router fronts, workers).

Once started, such a process holds a few hundred thousand GC-tracked objects that live until it exits:
the modules of torch, transformers and the project, the model's modules, the CUDA graphs' bookkeeping.
A full collection walks every one of them: about 130 ms on the CPU box for a worker's heap (305,000
objects with the 135M model loaded), a stall of the decode loop that shows as a maximum inter-token
gap. `freeze_startup_heap` moves them to the permanent generation, which collections skip, as vLLM
does after its engine starts (`freeze_gc_heap`); what serving allocates afterwards is collected as
before. `GcPauseMeter` counts the collections that still run, for the stats lines.

Torch-free: the router imports this too.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass


def freeze_startup_heap(young_threshold: int | None = None) -> int:
    """Collect what start-up left as garbage, then freeze every object alive now; returns how many
    objects are frozen. `young_threshold`: also make the youngest generation's collection run every
    that many net allocations instead of CPython's 700 (its older generations' ratios kept at 20 and
    100, i.e. twice and ten times CPython's 10 and 10)."""
    if young_threshold is not None and young_threshold < 1:
        raise ValueError(f"young_threshold must be at least 1, got {young_threshold}")
    gc.collect()
    gc.freeze()
    if young_threshold is not None:
        gc.set_threshold(young_threshold, 20, 100)
    return gc.get_freeze_count()


@dataclass(frozen=True)
class GcPauses:
    """The collections of one interval: how many, their summed and their longest wall time."""

    collections: int = 0
    full_collections: int = 0  # of the oldest generation
    total_s: float = 0.0
    max_s: float = 0.0


class GcPauseMeter:
    """Times every collection through `gc.callbacks` while installed; `take` returns the interval's
    figures and starts the next. A collection may run on any thread; the callbacks run under the GIL
    with the collection in between, so start and stop pair up."""

    def __init__(self) -> None:
        self._started = 0.0
        self._now = GcPauses()
        self._installed = False

    def install(self) -> None:
        if not self._installed:
            gc.callbacks.append(self._on_gc)
            self._installed = True

    def uninstall(self) -> None:
        if self._installed:
            gc.callbacks.remove(self._on_gc)
            self._installed = False

    def take(self) -> GcPauses:
        pauses, self._now = self._now, GcPauses()
        return pauses

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        now = self._now
        self._now = GcPauses(
            now.collections + 1,
            now.full_collections + (info.get("generation") == 2),
            now.total_s + took,
            max(now.max_s, took),
        )
