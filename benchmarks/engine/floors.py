"""Decode and prefill of one model against their floors, measured on this GPU in the same process.

    python benchmarks/engine/floors.py --random-model qwen3-8b          # on the GPU (weights drawn there)
    python benchmarks/engine/floors.py --model DIR --batches 1 64 --context 1000

Floors (issue 27): a decode step must read every weight the step uses (all but the embedding table,
which a step only gathers from) and the KV of every row's context, so its floor is those bytes over the
copy rate measured here (a large device-to-device copy: bytes read + written over its time). A prefill
must do its FLOPs (2 per weight per token, the causal attention products, the logits of each prompt's
last token), so the roofline share is FLOPs / time / the bf16 matmul rate measured here (the best of a
few large GEMMs). Prints one line per figure and the summary line of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.engine.latency import decode_tpot, prefill_throughput  # noqa: E402
from common import LLM  # noqa: E402
from common.tools.default_model import resolve_model  # noqa: E402
from common.tools.random_model import write_random_model  # noqa: E402


def _best_seconds(fn, repeats: int = 10) -> float:
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def copy_rate(gib: float = 4.0) -> float:
    """Bytes per second a large device-to-device copy moves (read + written)."""
    n = int(gib * 2**30) // 2
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    t = _best_seconds(lambda: dst.copy_(src))
    return 2 * n * 2 / t


def matmul_rate() -> float:
    """bf16 FLOP/s: the best of a few large GEMMs (square, and prefill-shaped ones)."""
    best = 0.0
    for m, k, n in ((8192, 8192, 8192), (16384, 4096, 12288), (16384, 12288, 4096)):
        a = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        b = torch.randn(k, n, dtype=torch.bfloat16, device="cuda")
        best = max(best, 2 * m * k * n / _best_seconds(lambda a=a, b=b: a @ b))
    return best


def model_bytes(llm: LLM) -> dict[str, int]:
    """Weight bytes a decode step reads (embedding table excluded unless tied to the head) and KV bytes
    per cached token."""
    model = llm.engine.runner.model
    tied = llm.engine.runner.model_config.tie_word_embeddings
    read = sum(
        p.numel() * p.element_size()
        for name, p in model.named_parameters()
        if tied or "embed_tokens" not in name
    )
    runner = llm.engine.runner
    return {"weights_read": read, "kv_per_token": runner.kv_bytes_per_block // llm.engine.block_size}


def prefill_flops(llm: LLM, prompts: int, length: int) -> float:
    cfg = llm.engine.runner.model_config
    hd = cfg.head_dim
    head = cfg.vocab_size * cfg.hidden_size
    linear = sum(p.numel() for n, p in llm.engine.runner.model.named_parameters() if p.dim() == 2) - head
    if not cfg.tie_word_embeddings:
        linear -= head  # the embedding table and the head are both 2-D: neither is a per-token GEMM
    attention = 2 * length * length * cfg.num_attention_heads * hd * cfg.num_hidden_layers
    return prompts * (2 * linear * length + attention + 2 * head)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--random-model", default=None, help="a common/tools/random_model.py preset")
    p.add_argument("--context", type=int, default=1000)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    p.add_argument("--decode-tokens", type=int, default=128)
    p.add_argument("--prefill-prompts", type=int, default=8)
    p.add_argument("--prefill-len", type=int, default=2048)
    p.add_argument("--json-out", default=None)
    args = p.parse_args()
    if not args.random_model:
        measure(resolve_model(args.model), args)
        return
    # The random copy (16 GB at the 8B shape) goes when the run ends, also when it fails.
    with tempfile.TemporaryDirectory() as tmp:
        written = write_random_model(Path(tmp) / args.random_model, args.random_model, device="cuda")
        measure(str(written), args)


def measure(model: str, args: argparse.Namespace) -> None:
    """Decode steps against their weight + KV floor, prefill against the matmul rate, for `model`."""
    rates = {"copy_bytes_per_s": copy_rate(), "matmul_flop_per_s": matmul_rate()}
    torch.cuda.empty_cache()
    llm = LLM(
        model,
        max_model_len=4096,
        enable_prefix_caching=False,
        # The prefill figure is one step of all its prompts, whichever decode batches are asked for.
        max_num_seqs=max(*args.batches, args.prefill_prompts),
        max_num_batched_tokens=max(args.prefill_prompts * args.prefill_len, 8192),
    )
    sizes = model_bytes(llm)
    result: dict = {"model": args.random_model or model, **rates, **sizes, "decode": {}}
    for rows in args.batches:
        step = decode_tpot(llm, args.context, args.decode_tokens, rows)
        floor = (sizes["weights_read"] + rows * args.context * sizes["kv_per_token"]) / rates[
            "copy_bytes_per_s"
        ]
        result["decode"][str(rows)] = {"ms": step * 1e3, "floor_ms": floor * 1e3, "ratio": step / floor}
        print(
            f"decode batch {rows} at {args.context} context: {step * 1e3:.3f} ms "
            f"(floor {floor * 1e3:.3f} ms, {step / floor:.2f}x)"
        )
    tok_s = prefill_throughput(llm, args.prefill_prompts, args.prefill_len)
    seconds = args.prefill_prompts * args.prefill_len / tok_s
    share = prefill_flops(llm, args.prefill_prompts, args.prefill_len) / seconds / rates["matmul_flop_per_s"]
    result["prefill"] = {"tok_per_s": tok_s, "roofline_share": share}
    print(
        f"prefill {args.prefill_prompts} x {args.prefill_len}: {tok_s:,.0f} tok/s, {share:.0%} of the "
        f"{rates['matmul_flop_per_s'] / 1e12:.0f} TFLOP/s matmul rate; copy rate "
        f"{rates['copy_bytes_per_s'] / 1e12:.2f} TB/s"
    )
    b1 = result["decode"][str(args.batches[0])]
    shape = args.random_model or Path(model).name
    print(
        f"engine {gpu_tag()} {shape}-shape: TPOT b{args.batches[0]} {b1['ms']:.2f} ms "
        f"(floor {b1['floor_ms']:.2f} ms), prefill {share:.0%} of roofline"
    )
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))
    llm.close()


def gpu_tag() -> str:
    """The GPU's model as the summary lines name it (H200, H100), else its full name."""
    name = torch.cuda.get_device_name()
    found = re.search(r"\b[A-Z]\d{2,3}\b", name)
    return found.group(0) if found else name.replace(" ", "-")


if __name__ == "__main__":
    main()
