"""Per-call cost of the sampler on the GPU: the fused Triton pass against the torch path.

python benchmarks/engine/sampling.py                 # batch 1, 64, 256 at vocab 151,936, bf16 logits
python benchmarks/engine/sampling.py --vocab 49152 151936 --batches 1 8 64 256 --top-p
python benchmarks/engine/sampling.py --sweep         # also the kernel alone at each programs-per-row count
python benchmarks/engine/sampling.py --top-k 20      # also Qwen3's T=0.6, top_k 20, top_p 0.95: the rows
                                                     # sorted against their best 20 (PDSERVE_TOPK_CANDIDATES),
                                                     # drawn by torch and by the candidate kernel

No CUDA graphs: `host` is the time to enqueue one call (perf_counter, no sync), `gpu` the device
time per call (CUDA events around a run of calls), `wall` the time per call of that run, synchronised.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from common.runner.sampler import Sampler, SamplingBatch  # noqa: E402


def make_batch(
    rows: int, temperature: float, device: torch.device, top_p: float = 1.0, top_k: int = 0
) -> SamplingBatch:
    """What prepare_sampling builds for `rows` rows of one temperature (and top-p or top-k: the torch
    path)."""
    filtered = top_p < 1.0 or top_k > 0
    return SamplingBatch(
        temperatures=torch.full((rows,), temperature, device=device),
        top_k=torch.full((rows,), top_k, device=device) if top_k else None,
        top_p=torch.full((rows,), top_p, device=device) if filtered else None,
        min_p=None,
        all_greedy=temperature == 0,
        any_greedy=temperature == 0,
        generators=[],
        plain_rows=[not filtered] * rows,
        top_k_bound=top_k or None,
    )


def time_calls(fn, iters: int) -> dict[str, float]:
    """Microseconds per call of `fn` (host enqueue, GPU, synchronised wall)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host = 0.0
    t0 = time.perf_counter()
    start.record()
    for _ in range(iters):
        h = time.perf_counter()
        fn()
        host += time.perf_counter() - h
    end.record()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    return {
        "host_us": round(host / iters * 1e6, 1),
        "gpu_us": round(start.elapsed_time(end) / iters * 1e3, 1),
        "wall_us": round(wall / iters * 1e6, 1),
    }


def compare(rows: int, vocab: int, temperature: float, iters: int, top_p: float = 1.0) -> dict:
    device = torch.device("cuda")
    logits = (torch.randn(rows, vocab, device=device) * 4).to(torch.bfloat16)
    batch = make_batch(rows, temperature, device, top_p)
    fused, eager = Sampler(fused=True), Sampler(fused=False)
    out = {"vocab": vocab, "batch": rows, "temperature": temperature, "top_p": top_p}
    out["fused"] = time_calls(lambda: fused(logits, batch), iters)
    out["torch"] = time_calls(lambda: eager(logits, batch), iters)
    out["speedup_wall"] = round(out["torch"]["wall_us"] / out["fused"]["wall_us"], 2)
    return out


def compare_top_k(rows: int, vocab: int, top_k: int, iters: int) -> dict:
    """The filtered rows at T=0.6, top_p 0.95 and `top_k`: each row sorted (torch), against its best
    `top_k` drawn by torch and by the candidate kernel."""
    device = torch.device("cuda")
    logits = (torch.randn(rows, vocab, device=device) * 4).to(torch.bfloat16)
    batch = make_batch(rows, 0.6, device, top_p=0.95, top_k=top_k)
    out: dict = {"vocab": vocab, "batch": rows, "top_k": top_k}
    for arm, candidates, fused in (
        ("sorted", "0", False),
        ("best", str(top_k), False),
        ("kernel", str(top_k), True),
    ):
        os.environ["PDSERVE_TOPK_CANDIDATES"] = candidates
        sampler = Sampler(fused=fused)  # reads the switch once, as the engine's does
        out[arm] = time_calls(lambda s=sampler: s(logits, batch), iters)
    for arm in ("best", "kernel"):
        out[f"speedup_{arm}"] = round(out["sorted"]["wall_us"] / out[arm]["wall_us"], 2)
    return out


def sweep(rows: int, vocab: int, iters: int) -> dict:
    """The kernel alone (temperature 0.6) at each count of programs per row."""
    from common.runner import sampling_kernel

    device = torch.device("cuda")
    logits = (torch.randn(rows, vocab, device=device) * 4).to(torch.bfloat16)
    temps = torch.full((rows,), 0.6, device=device)
    seeds = torch.randint(2**62, (rows,), device=device)
    chunks = -(-vocab // sampling_kernel.CHUNK)
    result = {"batch": rows, "default_splits": sampling_kernel.num_splits(rows, vocab, device)}
    for splits in sorted({1, 2, 4, 8, 16, chunks}):
        result[f"splits_{splits}"] = time_calls(
            lambda s=splits: sampling_kernel.pick_tokens(logits, temps, seeds, splits=s), iters
        )["gpu_us"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, nargs="+", default=[151_936])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument(
        "--top-p", action="store_true", help="also T=0.6 with top_p 0.9 (the torch path's sort)"
    )
    parser.add_argument("--sweep", action="store_true", help="also time the kernel per programs-per-row")
    parser.add_argument(
        "--top-k", type=int, default=0, help="also T=0.6, top_p 0.95 and this top_k, both ways"
    )
    parser.add_argument("--top-k-only", action="store_true", help="with --top-k: only the top-k table")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/engine/sampling.py needs a CUDA GPU")
    cases = [(0.0, 1.0), (0.6, 1.0)] + ([(0.6, 0.9)] if args.top_p else [])
    if args.top_k and args.top_k_only:
        cases = []
    results, top_k_results = [], []
    for vocab in args.vocab:
        for rows in args.batches:
            for temperature, top_p in cases:
                results.append(compare(rows, vocab, temperature, args.iters, top_p))
                print(json.dumps(results[-1]))
            if args.top_k:
                top_k_results.append(compare_top_k(rows, vocab, args.top_k, args.iters))
                print(json.dumps(top_k_results[-1]))
            if args.sweep:
                print(json.dumps(sweep(rows, vocab, args.iters)))
    if results:
        print("| vocab | batch | T | top_p | fused host / gpu / wall us | torch host / gpu / wall us |")
    for r in results:
        head = f"| {r['vocab']} | {r['batch']} | {r['temperature']} | {r['top_p']}"
        print(f"{head} | {_us(r['fused'])} | {_us(r['torch'])} |")
    if top_k_results:
        print(
            "| vocab | batch | top_k | sorted host / gpu / wall us | best (torch) | best (kernel)"
            " | speed torch / kernel |"
        )
    for r in top_k_results:
        head = f"| {r['vocab']} | {r['batch']} | {r['top_k']}"
        tail = f"{r['speedup_best']}x / {r['speedup_kernel']}x"
        print(f"{head} | {_us(r['sorted'])} | {_us(r['best'])} | {_us(r['kernel'])} | {tail} |")


def _us(timing: dict[str, float]) -> str:
    return f"{timing['host_us']} / {timing['gpu_us']} / {timing['wall_us']}"


if __name__ == "__main__":
    main()
