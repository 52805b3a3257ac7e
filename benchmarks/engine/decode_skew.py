"""Decode attention over a skewed batch: a few long contexts among short ones, with and without the
longest rows' help (decode_plan.SkewHelp, `PDSERVE_DECODE_SKEW_HELP`).

    python benchmarks/engine/decode_skew.py [--batches 64,256] [--short 512] [--short-max N] [--long 6000]
        [--long-rows 0,1,4]

An unsplit launch (a batch past one program per SM) lasts as long as its longest row's programs. Each
row here attends to `--short` tokens (or, with `--short-max`, a length drawn evenly from [--short,
--short-max]) except `--long-rows` rows at `--long` tokens; the arms are the kernel as the engine
launches it (longest first, unsplit), the same with the help as planned (rows >= 4x the median only)
and with the help for any length (`min_ratio` 0), each timed as CUDA-graph replays
(attention_setup.time_graph). Shapes: 8 KV heads, head_dim 128 (Qwen3-0.6B and -8B alike),
`--q-heads` query heads (32: the 8B shape's). "saved" is the planned help's per-step gain over
`--layers` layers. A row of 0 long rows is the help's cost on a batch that needs none
(`--short 100 --short-max 2048 --long-rows 0`: lengths like the offline standard workload's).
"""

from __future__ import annotations

import argparse
import dataclasses
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

ARMS = ("plain", "planned", "any length")  # no help; the help as planned; the help without its ratio rule


def time_arm(batch: int, short: tuple[int, int], long: int, long_rows: int, q_heads: int, arm: str) -> float:
    """Seconds per decode attention call (one layer) of this batch, as the engine launches it; `short`
    the range of the short rows' lengths."""
    longest = max(short[1], long)
    k_cache, v_cache, tables = make_paged(batch, longest, 16)
    gen = torch.Generator().manual_seed(batch * 1000 + long_rows)
    lens = torch.randint(short[0], short[1] + 1, (batch,), generator=gen, dtype=torch.int32).cuda()
    lens[torch.randperm(batch, generator=gen)[:long_rows].cuda()] = long
    q = torch.randn(batch, q_heads, HEAD_DIM, device="cuda", dtype=DTYPE)
    sms = num_sms(q.device)
    splits = choose_num_splits(batch, NUM_KV_HEADS, longest, sms)
    skew = skew_help(batch, NUM_KV_HEADS, splits, sms) if arm != "plain" else None
    if skew is not None and arm == "any length":
        skew = dataclasses.replace(skew, min_ratio=0)
    order = longest_first(lens) if splits == 1 else None

    def call() -> None:
        paged_decode_attention(
            q, k_cache, v_cache, tables, lens, HEAD_DIM**-0.5, splits, order=order, skew=skew
        )

    return time_graph(call)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main(argv: list[str] | None = None) -> list[tuple[int, int, float, float, float]]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=_ints, default=[64, 256])
    p.add_argument("--short", type=int, default=512)
    p.add_argument("--short-max", type=int, default=None, help="short rows drawn from [--short, this]")
    p.add_argument("--long", type=int, default=6000)
    p.add_argument("--long-rows", type=_ints, default=[0, 1, 4])
    p.add_argument("--q-heads", type=int, default=32)
    p.add_argument("--layers", type=int, default=36)
    args = p.parse_args(argv)
    short = (args.short, args.short if args.short_max is None else args.short_max)
    head = ("batch", 5), ("long rows", 9), ("unhelped us", 11), ("helped us", 10), ("any length us", 13)
    print(" ".join(f"{name:>{width}}" for name, width in head), f"{'ratio':>6} {'saved ms/step':>13}")
    rows = []
    for batch in args.batches:
        for long_rows in args.long_rows:
            shape = (batch, short, args.long, long_rows, args.q_heads)
            plain, helped, any_length = (time_arm(*shape, arm=arm) for arm in ARMS)
            saved = (plain - helped) * args.layers * 1e3
            print(
                f"{batch:>5} {long_rows:>9} {plain * 1e6:>11.1f} {helped * 1e6:>10.1f} "
                f"{any_length * 1e6:>13.1f} {helped / plain:>6.3f} {saved:>13.3f}"
            )
            rows.append((batch, long_rows, plain, helped, any_length))
            torch.cuda.empty_cache()
    return rows


if __name__ == "__main__":
    main()
