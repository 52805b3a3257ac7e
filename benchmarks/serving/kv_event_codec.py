"""What one step's cache-event batch costs on its way to the router fronts, evictions one per event
against evictions in one event (common/core/block_manager.py coalesces them).

    python benchmarks/serving/kv_event_codec.py [--stores 16] [--removals 80] [--rounds 2000]

A step of a full cache with 256 decode rows stores about 16 blocks and, with ~2 admitted 512-token
prompts, evicts about 80. The batch is pickled to the worker's channel process, encoded there once
and decoded by every front (common/wire/codec.py); each figure is the mean over `--rounds`.
"""

from __future__ import annotations

import argparse
import pickle
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from common.wire.cache_messages import KVEventBatch  # noqa: E402
from common.wire.codec import decode, encode  # noqa: E402
from common.wire.kv_events import BlockRemoved, BlockStored  # noqa: E402


def _mean_us(fn, rounds: int) -> float:
    began = time.perf_counter()
    for _ in range(rounds):
        fn()
    return (time.perf_counter() - began) / rounds * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stores", type=int, default=16)
    p.add_argument("--removals", type=int, default=80)
    p.add_argument("--rounds", type=int, default=2000)
    args = p.parse_args()
    rng = random.Random(0)
    stored = [BlockStored((rng.getrandbits(63),), rng.getrandbits(63)) for _ in range(args.stores)]
    gone = [rng.getrandbits(63) for _ in range(args.removals)]
    forms = {
        "one event per eviction": [BlockRemoved((h,)) for h in gone],
        "evictions in one event": [BlockRemoved(tuple(gone))],
    }
    for name, removed in forms.items():
        batch = KVEventBatch("w0", 1, stored + removed)
        data = encode(batch)
        pickled = _mean_us(lambda b=batch: pickle.loads(pickle.dumps(b)), args.rounds)
        encoded = _mean_us(lambda b=batch: encode(b), args.rounds)
        decoded = _mean_us(lambda d=data: decode(d), args.rounds)
        print(
            f"{name}: pickle round trip {pickled:.0f} us, encode {encoded:.0f} us, "
            f"decode {decoded:.0f} us (per front), {len(data):,} bytes"
        )


if __name__ == "__main__":
    main()
