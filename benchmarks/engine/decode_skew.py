"""Decode attention over a skewed batch: a few long contexts among short ones, with and without the
longest rows' help (decode_plan.SkewHelp, `PDSERVE_DECODE_SKEW_HELP`).

    python benchmarks/engine/decode_skew.py [--batches 64,256] [--short 512] [--long 6000] [--long-rows 0,1,4]

An unsplit launch (a batch past one program per SM) lasts as long as its longest row's programs. Each
row here attends to `--short` tokens except `--long-rows` rows at `--long` tokens; the arms are the
kernel as the engine launches it (longest first, unsplit) and the same with the help, each timed as
CUDA-graph replays (attention_setup.time_graph). Shapes: 8 KV heads, head_dim 128 (Qwen3-0.6B and
-8B alike), `--q-heads` query heads (32: the 8B shape's). The last column is the per-step cost over
`--layers` layers. A row of 0 long rows is the help's cost on a batch that needs none.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.engine.attention_setup import DTYPE, HEAD_DIM, NUM_KV_HEADS, make_paged, time_graph  # noqa: E402
from common.attention.triton_kernels.decode_attention import paged_decode_attention  # noqa: E402
from common.attention.triton_kernels.decode_plan import (  # noqa: E402
    choose_num_splits,
    longest_first,
    num_sms,
    skew_help,
)


def time_arm(batch: int, short: int, long: int, long_rows: int, q_heads: int, helped: bool) -> float:
    """Seconds per decode attention call (one layer) of this batch, as the engine launches it."""
    k_cache, v_cache, tables = make_paged(batch, max(short, long), 16)
    lens = torch.full((batch,), short, dtype=torch.int32, device="cuda")
    lens[torch.randperm(batch, device="cuda")[:long_rows]] = long
    q = torch.randn(batch, q_heads, HEAD_DIM, device="cuda", dtype=DTYPE)
    sms = num_sms(q.device)
    splits = choose_num_splits(batch, NUM_KV_HEADS, max(short, long), sms)
    skew = skew_help(batch, NUM_KV_HEADS, splits, sms) if helped else None
    order = longest_first(lens) if splits == 1 else None

    def call() -> None:
        paged_decode_attention(
            q, k_cache, v_cache, tables, lens, HEAD_DIM**-0.5, splits, order=order, skew=skew
        )

    return time_graph(call)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main(argv: list[str] | None = None) -> list[tuple[int, int, float, float]]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=_ints, default=[64, 256])
    p.add_argument("--short", type=int, default=512)
    p.add_argument("--long", type=int, default=6000)
    p.add_argument("--long-rows", type=_ints, default=[0, 1, 4])
    p.add_argument("--q-heads", type=int, default=32)
    p.add_argument("--layers", type=int, default=36)
    args = p.parse_args(argv)
    head = ("batch", 5), ("long rows", 9), ("unhelped us", 11), ("helped us", 10), ("ratio", 6)
    print(" ".join(f"{name:>{width}}" for name, width in head), f"{'saved ms/step':>13}")
    rows = []
    for batch in args.batches:
        for long_rows in args.long_rows:
            shape = (batch, args.short, args.long, long_rows, args.q_heads)
            plain, helped = time_arm(*shape, helped=False), time_arm(*shape, helped=True)
            saved = (plain - helped) * args.layers * 1e3
            print(
                f"{batch:>5} {long_rows:>9} {plain * 1e6:>11.1f} {helped * 1e6:>10.1f} "
                f"{helped / plain:>6.3f} {saved:>13.3f}"
            )
            rows.append((batch, long_rows, plain, helped))
            torch.cuda.empty_cache()
    return rows


if __name__ == "__main__":
    main()
