"""Speculative decoding (n-gram prompt lookup): acceptance and per-token decode time vs no speculation.

    python benchmarks/speculative.py                      # default model, CPU-sized
    python benchmarks/speculative.py --ks 1 2 4 8 --batches 1 32 --max-tokens 64

Workloads: copy-heavy (chat prompts asking to repeat or lightly edit a passage: the answer repeats the
prompt) and free-writing (open-ended prompts). Greedy decoding, so outputs must be identical with and
without speculation; the script checks that. Time per output token = decode wall time after the first
token / tokens generated after it, per sequence.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import LLM, SamplingParams  # noqa: E402
from common.default_model import resolve_model  # noqa: E402
from common.speculative import NgramProposer, SpecStats, SpeculativeConfig  # noqa: E402

PASSAGE = (
    "The river rose slowly through the night, and by morning the low fields near the mill were under "
    "water. Farmers moved their animals to the hill, where the old chapel stood, and waited for the rain "
    "to stop. By noon the sky had cleared, the water began to fall, and children came out to watch the "
    "boats drift past the flooded road."
)
COPY = [
    f"Repeat the following passage exactly, word for word:\n\n{PASSAGE}",
    f"Rewrite this passage in the present tense, changing nothing else:\n\n{PASSAGE}",
    f"Copy this text and put it in quotation marks:\n\n{PASSAGE}",
    f"Here is a passage. Print it again without changes.\n\n{PASSAGE}",
]
FREE = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Describe your ideal weekend in a few sentences.",
    "Explain how a bicycle works to a ten-year-old.",
    "Write a poem about autumn leaves.",
]


def prompts_for(llm: LLM, texts: list[str], batch: int) -> list[list[int]]:
    tok = llm.tokenizer
    rendered = [
        tok.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True)
        for t in texts
    ]
    return [tok.encode(rendered[i % len(rendered)]) for i in range(batch)]


def run(
    llm: LLM, prompts: list[list[int]], k: int, max_tokens: int
) -> tuple[float, list[list[int]], SpecStats]:
    engine = llm.engine
    spec = SpeculativeConfig(k) if k else None  # default max_batch: large batches do not speculate
    engine.scheduler.proposer = NgramProposer(spec, engine.max_model_len) if spec else None
    engine.scheduler.spec_stats = SpecStats()
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    seqs = [engine.add_request(p, params) for p in prompts]
    while any(s.num_completion_tokens == 0 for s in seqs):
        engine.step()  # prefill: every sequence has its first token
    t0 = time.perf_counter()
    while engine.has_unfinished:
        engine.step()
    elapsed = time.perf_counter() - t0
    return elapsed / (max_tokens - 1), [s.completion_token_ids for s in seqs], engine.scheduler.spec_stats


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    p.add_argument("--max-tokens", type=int, default=64)
    args = p.parse_args()
    llm = LLM(resolve_model(args.model), max_num_seqs=max(args.batches), num_kvcache_blocks=4096)
    print(f"{'workload':<10}{'batch':>6}{'k':>4}{'ms/token':>10}{'speedup':>9}{'accept':>8}{'tok/step':>9}")
    for name, texts in (("copy", COPY), ("free", FREE)):
        for batch in args.batches:
            prompts = prompts_for(llm, texts, batch)
            run(llm, prompts, 0, 4)  # warm-up
            base, ref, _ = run(llm, prompts, 0, args.max_tokens)
            print(f"{name:<10}{batch:>6}{0:>4}{base * 1e3:>10.1f}{1.0:>9.2f}{'-':>8}{'-':>9}")
            for k in args.ks:
                tpot, outs, stats = run(llm, prompts, k, args.max_tokens)
                if outs != ref:
                    raise SystemExit(f"outputs differ with k={k} ({name}, batch {batch})")
                print(
                    f"{name:<10}{batch:>6}{k:>4}{tpot * 1e3:>10.1f}{base / tpot:>9.2f}"
                    f"{stats.acceptance_rate:>8.2f}{stats.tokens_per_step:>9.2f}"
                )


if __name__ == "__main__":
    main()
