"""Offline throughput on the standard workload (nano-vllm's bench.py), optionally vs transformers.

Workload: seed 0; `--num-seqs` prompts (default 256) of random length in [min,max] input tokens with
ids drawn from [0, 10000); each with max_tokens random in [min,max] output; temperature 0.6;
ignore_eos; max_model_len 4096; one warm-up generate; throughput = output tokens / wall time.

    python benchmarks/engine/offline.py                                   # full workload, default model
    python benchmarks/engine/offline.py --random-model qwen3-0.6b         # fixed-seed Qwen3-0.6B weights
    python benchmarks/engine/offline.py --num-seqs 16 --input-len 64 256 --output-len 128 128 --compare-hf
    python benchmarks/engine/offline.py ... --compare-hf --dtype bfloat16 --hf-dtype float32 bfloat16

`--served-set` runs instead exactly the requests of `benchmarks/serving/serving.py`'s random workload for
the same `--num-seqs`, lengths (MIN = MAX) and `--seed` (the same prompt token ids, max_tokens and
ignore_eos), so a served figure can be set against the offline engine on the same requests.

transformers runs in the engine's dtype unless `--hf-dtype` names one or more dtypes; each gets its own
timed `generate` and ratio line, so every ratio of one call is measured on the same box at the same time.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from common import LLM, SamplingParams  # noqa: E402
from common.tools.default_model import resolve_model  # noqa: E402
from common.tools.random_model import write_random_model  # noqa: E402

# benchmarks/regress.sh runs this script on its base tree too, which may predate what it calls: the
# frozen start-up heap (common/net/gc_heap.py) and StepTimings.reset (both since 2026-12-04).
try:
    from common.net.gc_heap import freeze_startup_heap
except ImportError:

    def freeze_startup_heap() -> None:
        gc.collect()
        gc.freeze()


def reset_timings(engine) -> None:
    if hasattr(engine.timings, "reset"):
        engine.timings.reset()
    else:
        engine.timings = type(engine.timings)()


def add_workload_args(p: argparse.ArgumentParser) -> None:
    """The standard workload's arguments (module docstring), for every script that runs or costs it;
    parse with `parse_workload_args`."""
    p.add_argument("--num-seqs", type=int, default=256)
    p.add_argument("--input-len", type=int, nargs=2, default=[100, 1024], metavar=("MIN", "MAX"))
    p.add_argument("--output-len", type=int, nargs=2, default=[100, 1024], metavar=("MIN", "MAX"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--served-set", action="store_true", help="serving.py's random workload (fixed lengths: MIN = MAX)"
    )


def parse_workload_args(p: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    args = p.parse_args(argv)
    fixed = args.input_len[0] == args.input_len[1] and args.output_len[0] == args.output_len[1]
    if args.served_set and not fixed:
        p.error("--served-set needs fixed lengths: --input-len N N --output-len M M")
    return args


def make_workload(args) -> tuple[list[list[int]], list[int]]:
    if args.served_set:
        from benchmarks.serving.workloads import random_workload

        served = random_workload(args.num_seqs, args.input_len[0], args.output_len[0], args.seed)
        return [r.prompt for r in served], [r.max_tokens for r in served]
    rng = random.Random(args.seed)
    prompts = [
        [rng.randint(0, 10000 - 1) for _ in range(rng.randint(*args.input_len))] for _ in range(args.num_seqs)
    ]
    outputs = [rng.randint(*args.output_len) for _ in range(args.num_seqs)]
    return prompts, outputs


def run_engine(model: str, prompts, outputs, args) -> dict:
    engine_kwargs = json.loads(args.engine_kwargs)
    llm = LLM(model, max_model_len=4096, enforce_eager=args.enforce_eager, dtype=args.dtype, **engine_kwargs)
    params = [
        SamplingParams(
            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, ignore_eos=True, max_tokens=n
        )
        for n in outputs
    ]
    # Warm-up on a slice of the real workload, so one-off compilation stays out of the timing.
    llm.generate(prompts[:8], [SamplingParams(max_tokens=16)] * min(8, len(prompts)), use_tqdm=False)
    reset_timings(llm.engine)
    # As a served worker does once it is ready: a served figure is set against this one, so neither
    # may pay for full collections over the start-up heap that the other skips.
    freeze_startup_heap()
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=not args.quiet)
    elapsed = time.perf_counter() - t0
    total = sum(len(o["token_ids"]) for o in outs)
    timings = asdict(llm.engine.timings)
    print("step timings (s):", {k: round(v, 3) if isinstance(v, float) else v for k, v in timings.items()})
    return {
        "engine": "pdserve",
        "output_tokens": total,
        "seconds": elapsed,
        "tok_per_s": total / elapsed,
        "timings": timings,
    }


def run_transformers(model: str, prompts, outputs, args, dtype_name: str) -> dict:
    """transformers' batched generate on the same prompts; the batch runs to the longest output."""
    import torch
    import transformers

    # "auto" is the engine's rule (bf16 on CUDA, fp32 on the CPU), so both read the same weight bytes.
    auto = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    dtype = auto if dtype_name == "auto" else getattr(torch, dtype_name)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    hf = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(device).eval()
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):  # left padding, as batched generation needs
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    new = max(outputs)
    kwargs = dict(
        do_sample=True,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        max_new_tokens=new,
        min_new_tokens=new,
    )
    with torch.no_grad():
        hf.generate(ids[:1, -8:].to(device), max_new_tokens=2, pad_token_id=0)  # warm-up
        t0 = time.perf_counter()
        hf.generate(ids.to(device), attention_mask=mask.to(device), pad_token_id=0, **kwargs)
        elapsed = time.perf_counter() - t0
    # Only each prompt's own requested tokens count as useful output, as for our engine.
    total = sum(outputs)
    return {
        "engine": f"hf {str(dtype).removeprefix('torch.')}",
        "output_tokens": total,
        "seconds": elapsed,
        "tok_per_s": total / elapsed,
    }


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="HF model dir (default: the default model)")
    p.add_argument("--random-model", default=None, help="write and use fixed-seed weights of this preset")
    add_workload_args(p)
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--top-k", type=int, default=0, help="every request's top_k (0: off; Qwen3's config: 20)")
    p.add_argument("--top-p", type=float, default=1.0, help="every request's top_p (Qwen3's config: 0.95)")
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--dtype", default="auto", help="engine (and transformers) dtype, e.g. bfloat16")
    p.add_argument(
        "--engine-kwargs",
        default="{}",
        help="extra EngineConfig fields as JSON, e.g. '{\"max_num_seqs\": 512}'",
    )
    p.add_argument("--compare-hf", action="store_true", help="also time transformers' generate")
    p.add_argument(
        "--hf-dtype", nargs="+", default=None, help="transformers dtype(s) (default: the engine's --dtype)"
    )
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--json-out", default=None)
    return parse_workload_args(p)


def main() -> None:
    args = parse_args()
    if args.random_model:
        model = str(write_random_model(Path(tempfile.mkdtemp()) / args.random_model, args.random_model))
    else:
        model = resolve_model(args.model)
    prompts, outputs = make_workload(args)
    results = [run_engine(model, prompts, outputs, args)]
    if args.compare_hf:
        for dtype_name in args.hf_dtype or [args.dtype]:
            results.append(run_transformers(model, prompts, outputs, args, dtype_name))
    print(f"\n{'engine':<14}{'output tok':>12}{'seconds':>10}{'tok/s':>12}")
    for r in results:
        print(f"{r['engine']:<14}{r['output_tokens']:>12}{r['seconds']:>10.2f}{r['tok_per_s']:>12.1f}")
    for hf in results[1:]:
        ratio = results[0]["tok_per_s"] / hf["tok_per_s"]
        print(f"ratio pdserve {args.dtype} / {hf['engine']}: {ratio:.2f}x")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
