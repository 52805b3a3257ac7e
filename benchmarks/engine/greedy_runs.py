"""What a random-weight model's greedy output looks like: how much of it a borrowed tokenizer can show.

    python benchmarks/engine/greedy_runs.py [--preset qwen3-0.6b] [--tokenizer-vocab 49152] [--prompts 8]
        [--max-tokens 256] [--device cpu]

Served benchmarks on random-weight shapes borrow the default model's tokenizer (49,152 ids) for models
of larger vocabularies (151,936 for the Qwen3 shapes): an id the tokenizer lacks decodes to no text, so
its token streams no SSE chunk, and a client measuring gaps between text chunks measures the run of
such ids instead of the server. Per request: the share of ids the tokenizer lacks, the longest run of
them, and how many distinct ids the output has (greedy on random weights settles on one or two).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def longest_run(flags: list[bool]) -> int:
    longest = current = 0
    for flag in flags:
        current = current + 1 if flag else 0
        longest = max(longest, current)
    return longest


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="qwen3-0.6b")
    ap.add_argument("--tokenizer-vocab", type=int, default=49_152, help="ids the borrowed tokenizer has")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    from common import LLM, SamplingParams
    from common.tools.random_model import write_random_model

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        dtype = "float32" if args.device == "cpu" else "bfloat16"
        model = write_random_model(Path(tmp) / args.preset, args.preset, dtype=dtype, device=args.device)
        llm = LLM(str(model), device=args.device, max_model_len=args.prompt_len + args.max_tokens + 1)
        rng = random.Random(0)
        prompts = [[rng.randrange(1000, 40000) for _ in range(args.prompt_len)] for _ in range(args.prompts)]
        params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
        for out in llm.generate(prompts, params):
            lacking = [i >= args.tokenizer_vocab for i in out["token_ids"]]
            rows.append(
                {
                    "lacking share": sum(lacking) / len(lacking),
                    "longest lacking run": longest_run(lacking),
                    "distinct ids": len(set(out["token_ids"])),
                }
            )
    print("| request | ids the tokenizer lacks | longest run of them | distinct ids |")
    print("| --- | --- | --- | --- |")
    for i, r in enumerate(rows):
        print(f"| {i} | {r['lacking share']:.2f} | {r['longest lacking run']} | {r['distinct ids']} |")
    return rows


if __name__ == "__main__":
    main()
