"""Tensor parallelism 1 vs N: batch-1 decode TPOT and offline throughput (run on a multi-GPU host).

    python benchmarks/engine/tp_compare.py --random-model qwen3-0.6b --tp 1 2
    python benchmarks/engine/tp_compare.py --model /path/to/hf-dir --tp 1 2 --num-seqs 64 --json-out tp.json

Each TP size gets a fresh `LLM` (closed before the next starts). TP > 1 runs eager steps without
run-ahead (the engine turns both off), so TP=1 is also measured that way unless `--graphs`.
"""

from __future__ import annotations

import argparse
import gc
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


def _random_ids(llm: LLM, n: int, rng: random.Random) -> list[int]:
    return [rng.randrange(min(10000, llm.engine.model_config.vocab_size)) for _ in range(n)]


def decode_tpot(llm: LLM, context: int, tokens: int) -> float:
    """Seconds per output token for one sequence with `context` tokens cached (as
    benchmarks/engine/latency.py)."""
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=tokens + 9, ignore_eos=True)
    engine.add_request(_random_ids(llm, context, random.Random(0)), params)
    for _ in range(9):  # the prefill, then warm-up decode steps
        engine.step()
    llm.engine.runner.platform.synchronize()
    t0, steps = time.perf_counter(), 0
    while engine.has_unfinished:
        engine.step()
        steps += 1
    llm.engine.runner.platform.synchronize()
    return (time.perf_counter() - t0) / steps


def offline_throughput(llm: LLM, num_seqs: int, input_len: int, output_len: int) -> dict:
    """Output tokens per second for `num_seqs` random prompts (one warm-up generate first)."""
    rng = random.Random(0)
    prompts = [_random_ids(llm, input_len, rng) for _ in range(num_seqs)]
    params = SamplingParams(temperature=0.6, max_tokens=output_len, ignore_eos=True, seed=0)
    llm.generate(prompts[: min(4, num_seqs)], params, use_tqdm=False)
    llm.engine.runner.platform.synchronize()
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    llm.engine.runner.platform.synchronize()
    seconds = time.perf_counter() - t0
    tokens = sum(len(o["token_ids"]) for o in outs)
    return {"output_tok_per_s": tokens / seconds, "seconds": seconds, "output_tokens": tokens}


def measure(model: str, tp: int, args) -> dict:
    llm = LLM(
        model,
        tensor_parallel_size=tp,
        max_model_len=args.max_model_len,
        max_num_seqs=max(args.num_seqs, 1),
        enforce_eager=not args.graphs,
        async_scheduling=None if args.graphs else False,
        num_kvcache_blocks=args.num_kvcache_blocks,
        enable_prefix_caching=False,
        gpu_memory_utilization=args.gpu_memory_utilization,
    )
    try:
        tpot = decode_tpot(llm, args.context, args.decode_tokens)
        offline = offline_throughput(llm, args.num_seqs, args.input_len, args.output_len)
    finally:
        llm.close()
        del llm
        gc.collect()
    return {"tp": tp, "tpot_ms": tpot * 1e3, **offline}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--random-model", default=None, help="e.g. qwen3-0.6b (fixed-seed random weights)")
    p.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    p.add_argument("--context", type=int, default=1000)
    p.add_argument("--decode-tokens", type=int, default=128)
    p.add_argument("--num-seqs", type=int, default=64)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.8)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--num-kvcache-blocks", type=int, default=None, help="default: from free memory")
    p.add_argument(
        "--graphs", action="store_true", help="CUDA graphs + run-ahead for TP=1 (TP>1 stays eager)"
    )
    p.add_argument("--json-out", default=None)
    args = p.parse_args()
    if args.random_model:
        model = str(write_random_model(Path(tempfile.mkdtemp()) / args.random_model, args.random_model))
    else:
        model = resolve_model(args.model)
    rows = [measure(model, tp, args) for tp in args.tp]
    for row in rows:
        print(
            f"TP={row['tp']}: batch-1 TPOT {row['tpot_ms']:.3f} ms/token, "
            f"offline {row['output_tok_per_s']:,.0f} output tok/s ({args.num_seqs} seqs)"
        )
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
