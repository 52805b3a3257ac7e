"""Where the offline standard workload's GPU time goes: kernels by name, GPU busy time against wall time.

    python benchmarks/engine/offline_profile.py --model DIR [--num-seqs 256] [--top 25] [--json-out F]

Runs the same workload as `benchmarks/engine/offline.py` (one warm-up generate, then the timed one) under the
PyTorch profiler with CUDA activity only. GPU busy time is the union of all kernel and copy intervals,
so `wall - busy` is the time the GPU sat idle waiting for the host. Kernels are grouped into families
(decode attention, projections, sampling, prefill attention, ...) by name so the table reads as a budget.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from benchmarks.engine.offline import add_workload_args, make_workload, parse_workload_args  # noqa: E402
from common import LLM, SamplingParams  # noqa: E402

# Name fragments -> family; the first match wins, so more specific fragments come first.
_FAMILIES = (
    ("_decode_kernel", "decode attention"),
    ("prefill", "prefill attention"),
    ("skinny", "skinny projections"),
    ("gemm", "cuBLAS GEMM"),
    ("nvjet", "cuBLAS GEMM"),
    ("sm90", "cuBLAS GEMM"),
    ("splitK", "cuBLAS GEMM"),
    ("sampl", "sampling"),
    ("softmax", "sampling"),
    ("argmax", "sampling"),
    ("exponential", "sampling"),
    ("reduce", "reductions"),
    ("norm", "norms"),
    ("rope", "rope/kv store"),
    ("store", "rope/kv store"),
    ("Memcpy", "copies"),
    ("copy", "copies"),
)


def family(name: str) -> str:
    low = name.lower()
    return next((fam for frag, fam in _FAMILIES if frag.lower() in low), "other")


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def profile_run(args) -> dict:
    prompts, outputs = make_workload(args)
    llm = LLM(args.model, max_model_len=4096, max_num_seqs=args.max_num_seqs)
    params = [SamplingParams(temperature=args.temperature, ignore_eos=True, max_tokens=n) for n in outputs]
    warm = prompts[:8]
    llm.generate(warm, [SamplingParams(max_tokens=16)] * len(warm), use_tqdm=False)
    _sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        _sync()
        wall = time.perf_counter() - t0
    micros: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    intervals = []
    for evt in prof.events():
        if evt.device_type != torch.autograd.DeviceType.CUDA:
            continue
        micros[evt.name] += evt.device_time
        count[evt.name] += 1
        intervals.append((evt.time_range.start, evt.time_range.end))
    families: dict[str, float] = defaultdict(float)
    for name, us in micros.items():
        families[family(name)] += us
    top = sorted(micros, key=lambda n: -micros[n])[: args.top]
    return {
        "wall_s": wall,
        "output_tokens": sum(len(o["token_ids"]) for o in outs),
        "gpu_busy_s": busy_us(intervals) / 1e6,
        "kernel_sum_s": sum(micros.values()) / 1e6,
        "families_s": {k: v / 1e6 for k, v in sorted(families.items(), key=lambda kv: -kv[1])},
        "top": [{"name": n[:90], "calls": count[n], "s": micros[n] / 1e6} for n in top],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    add_workload_args(p)
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--json-out", default=None)
    args = parse_workload_args(p)
    res = profile_run(args)
    print(
        f"wall {res['wall_s']:.3f} s, GPU busy {res['gpu_busy_s']:.3f} s "
        f"({100 * res['gpu_busy_s'] / res['wall_s']:.1f}%), kernel sum {res['kernel_sum_s']:.3f} s, "
        f"{res['output_tokens'] / res['wall_s']:.0f} tok/s under the profiler"
    )
    for fam, secs in res["families_s"].items():
        print(f"  {fam:<22} {secs:7.3f} s")
    for k in res["top"]:
        print(f"  {k['s']:7.3f} s {k['calls']:7d}  {k['name']}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
