"""How long a full garbage collection stalls a process holding a loaded engine, before and after the
start-up heap is frozen (common/net/gc_heap.py, what every worker does once started).

    python benchmarks/engine/gc_pause.py [--model DIR] [--repeats 5] [--requests 64]

Loads the engine as a worker does (on the GPU when there is one, else on the CPU), serves `--requests`
short greedy requests so the serving path's lazy state exists too, counts the objects the collector
tracks, and times `gc.collect()` (a full collection: what CPython runs now and then once enough
objects have survived the younger ones) `--repeats` times; then freezes the heap and times it again.
Prints each time in ms and the medians.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from common import LLM, SamplingParams  # noqa: E402
from common.net.gc_heap import freeze_startup_heap  # noqa: E402
from common.tools.default_model import resolve_model  # noqa: E402


def full_collections_ms(repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        gc.collect()
        times.append(1e3 * (time.perf_counter() - began))
    return times


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="HF model dir (default: the default model)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--requests", type=int, default=64)
    args = p.parse_args(argv)
    if args.repeats < 1 or args.requests < 0:
        p.error("--repeats must be at least 1 and --requests at least 0")
    llm = LLM(resolve_model(args.model), num_kvcache_blocks=256)
    prompts = [[(7 * i + j) % 1000 + 1 for j in range(32)] for i in range(args.requests)]
    if prompts:
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    tracked = len(gc.get_objects())
    before = full_collections_ms(args.repeats)
    frozen = freeze_startup_heap()
    after = full_collections_ms(args.repeats)
    print(f"objects tracked: {tracked:,}; frozen: {frozen:,}")
    for name, times in (("full collection, as started", before), ("full collection, frozen", after)):
        print(
            f"{name:<30} median {statistics.median(times):8.2f} ms  ({' / '.join(f'{t:.2f}' for t in times)})"
        )
    return {"tracked": tracked, "frozen": frozen, "before_ms": before, "after_ms": after}


if __name__ == "__main__":
    main()
