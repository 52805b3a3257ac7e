"""Decode latency at batch 1 and prefill throughput, measured on the engine's own step loop.

python benchmarks/engine/latency.py --random-model qwen3-0.6b          # on the GPU
python benchmarks/engine/latency.py --context 1000 --decode-tokens 256 --prefill-prompts 8 --prefill-len 2048
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from common import LLM, SamplingParams  # noqa: E402
from common.tools.default_model import resolve_model  # noqa: E402
from common.tools.random_model import write_random_model  # noqa: E402


def _sync(llm: LLM) -> None:
    llm.engine.runner.platform.synchronize()


def decode_tpot(llm: LLM, context: int, tokens: int) -> float:
    """Seconds per output token for one sequence with `context` tokens already cached."""
    engine = llm.engine
    prompt = [random.Random(0).randrange(10000) for _ in range(context)]
    engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=tokens + 1, ignore_eos=True))
    engine.step()  # prefill (and the first token)
    for _ in range(8):  # warm-up decode steps
        engine.step()
    _sync(llm)
    t0 = time.perf_counter()
    steps = 0
    while engine.has_unfinished:
        engine.step()
        steps += 1
    _sync(llm)
    return (time.perf_counter() - t0) / steps


def prefill_throughput(llm: LLM, prompts: int, length: int) -> float:
    rng = random.Random(1)
    batch = [[rng.randrange(10000) for _ in range(length)] for _ in range(prompts)]
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    llm.generate(batch, params, use_tqdm=False)  # warm-up on the same shapes (prefix caching is off)
    best = float("inf")
    for _ in range(3):
        _sync(llm)
        t0 = time.perf_counter()
        llm.generate(batch, params, use_tqdm=False)
        _sync(llm)
        best = min(best, time.perf_counter() - t0)
    return prompts * length / best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--random-model", default=None)
    p.add_argument("--context", type=int, default=1000)
    p.add_argument("--decode-tokens", type=int, default=256)
    p.add_argument("--prefill-prompts", type=int, default=8)
    p.add_argument("--prefill-len", type=int, default=2048)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--json-out", default=None)
    args = p.parse_args()
    if args.random_model:
        model = str(write_random_model(Path(tempfile.mkdtemp()) / args.random_model, args.random_model))
    else:
        model = resolve_model(args.model)
    budget = max(args.prefill_prompts * args.prefill_len, 8192)
    llm = LLM(
        model,
        max_model_len=4096,
        enforce_eager=args.enforce_eager,
        enable_prefix_caching=False,
        max_num_batched_tokens=budget,
        max_num_seqs=64,
    )
    tpot = decode_tpot(llm, args.context, args.decode_tokens)
    prefill = prefill_throughput(llm, args.prefill_prompts, args.prefill_len)
    result = {
        "tpot_ms": tpot * 1e3,
        "prefill_tok_per_s": prefill,
        "context": args.context,
        "eager": args.enforce_eager,
    }
    print(f"batch-1 decode at {args.context} context: {tpot * 1e3:.3f} ms/token")
    print(f"prefill {args.prefill_prompts} x {args.prefill_len}: {prefill:,.0f} tok/s")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
