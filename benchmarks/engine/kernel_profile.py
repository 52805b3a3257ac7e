"""Kernels per decode step and where their GPU time goes, from the profiler over CUDA-graph replays.

python benchmarks/engine/kernel_profile.py --model DIR [--rows 1 64 256] [--context 1000] [--json-out F]

Each captured decode graph (one per row count) is replayed with every row attending to `--context`
tokens; the profiler's kernel records are grouped by kernel name and divided by the number of replays.
The sampler is timed on its own (eager, as the engine runs it) for greedy and T=0.6 rows.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from common import LLM, SamplingParams  # noqa: E402
from common.core.sequence import Sequence  # noqa: E402
from common.runner.inputs import prepare_sampling  # noqa: E402

_REPLAYS = 20


def kernel_table(llm: LLM, rows: int, context: int) -> dict:
    """Per kernel name: launches per step and microseconds per step, for one replayed graph."""
    graphs = llm.engine.runner.graphs
    graphs.measure_costs(context, repeats=2)  # fills every row's inputs with `context` tokens
    graph = graphs.graphs[rows]
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(_REPLAYS):
            graph.replay()
        torch.cuda.synchronize()
    count: dict[str, int] = defaultdict(int)
    micros: dict[str, float] = defaultdict(float)
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            count[evt.name] += 1
            micros[evt.name] += evt.device_time
    kernels = sorted(
        ({"name": n, "per_step": count[n] / _REPLAYS, "us_per_step": micros[n] / _REPLAYS} for n in count),
        key=lambda k: -k["us_per_step"],
    )
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(_REPLAYS):
        graph.replay()
    end.record()
    end.synchronize()
    return {
        "rows": rows,
        "context": context,
        "replay_ms": start.elapsed_time(end) / _REPLAYS,
        "kernels_per_step": sum(k["per_step"] for k in kernels),
        "kernel_us_per_step": sum(k["us_per_step"] for k in kernels),
        "kernels": kernels,
    }


def sampler_us(llm: LLM, rows: int, temperature: float) -> float:
    """Wall microseconds of one eager sampler call on [rows, vocab] logits (host launch + GPU)."""
    runner = llm.engine.runner
    vocab = runner.model_config.vocab_size
    logits = torch.randn(rows, vocab, device=runner.device, dtype=runner.dtype)
    params = SamplingParams(temperature=temperature)
    seqs = [Sequence([1, 2, 3], params, runner.block_size) for _ in range(rows)]
    batch = prepare_sampling(seqs, vocab, runner.device, runner.model_config.eos_token_ids)
    for _ in range(3):
        runner.sampler(logits, batch)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(_REPLAYS):
        runner.sampler(logits, batch)
    end.record()
    end.synchronize()
    return 1e3 * start.elapsed_time(end) / _REPLAYS


def _short(name: str) -> str:
    return name if len(name) <= 70 else name[:67] + "..."


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 64, 256])
    p.add_argument("--context", type=int, default=1000)
    p.add_argument("--top", type=int, default=14, help="kernels listed per row count")
    p.add_argument("--json-out", default=None)
    args = p.parse_args()
    llm = LLM(args.model, max_model_len=4096, max_num_seqs=max(args.rows))
    result = {"tables": [], "sampler_us": {}}
    for rows in args.rows:
        t = kernel_table(llm, rows, args.context)
        result["tables"].append(t)
        print(
            f"\n== {rows} rows @ {args.context} ctx: replay {t['replay_ms']:.3f} ms, "
            f"{t['kernels_per_step']:.0f} kernels, {t['kernel_us_per_step']:.0f} us of kernel time =="
        )
        for k in t["kernels"][: args.top]:
            each = k["us_per_step"] / k["per_step"]
            print(f"{k['per_step']:6.1f} x {each:7.2f} us = {k['us_per_step']:8.1f}  {_short(k['name'])}")
    for rows in args.rows:
        for temp in (0.0, 0.6):
            us = sampler_us(llm, rows, temp)
            result["sampler_us"][f"{rows}@T{temp}"] = us
            print(f"sampler {rows:4d} rows T={temp}: {us:8.1f} us per call")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
