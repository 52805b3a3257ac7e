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


def decode_tpot(llm: LLM, context: int, tokens: int, rows: int = 1) -> float:
    """Seconds per decode step for `rows` sequences with `context` tokens already cached each (one
    output token per sequence per step). Timing starts once every prompt is in; the sequences whose
    prompts went in a chunked step earlier end a step or two earlier, so the last steps are lighter."""
    engine = llm.engine
    for row in range(rows):
        rng = random.Random(row)
        prompt = [rng.randrange(10000) for _ in range(context)]
        engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=tokens + 1, ignore_eos=True))
    budget = engine.config.max_num_batched_tokens
    for _ in range(-(-rows * context // budget) + 8):  # the prompts (and first tokens), then warm-up steps
        engine.step()
    _sync(llm)
    t0 = time.perf_counter()
    steps = 0
    while engine.has_unfinished:
        engine.step()
        steps += 1
    _sync(llm)
    if steps == 0:
        raise ValueError(f"decode_tokens: {tokens} tokens leave no step to time after the warm-up steps")
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
    p.add_argument("--decode-batches", type=int, nargs="+", default=[1], help="rows per decode step (<= 64)")
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
    tpots = {rows: decode_tpot(llm, args.context, args.decode_tokens, rows) for rows in args.decode_batches}
    prefill = prefill_throughput(llm, args.prefill_prompts, args.prefill_len)
    result = {
        "tpot_ms": tpots[args.decode_batches[0]] * 1e3,
        "tpot_ms_by_batch": {str(rows): t * 1e3 for rows, t in tpots.items()},
        "prefill_tok_per_s": prefill,
        "context": args.context,
        "eager": args.enforce_eager,
    }
    for rows, t in tpots.items():
        print(f"batch-{rows} decode at {args.context} context: {t * 1e3:.3f} ms/token")
    print(f"prefill {args.prefill_prompts} x {args.prefill_len}: {prefill:,.0f} tok/s")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
