"""What structured output costs per token: the grammar mask's host time, and decode throughput with
and without a grammar at the same batch size and output length.

Workload: `--batch-sizes` sequences of one chat prompt each, greedy, `--max-tokens` output tokens per
sequence. Grammar run: a JSON schema whose array needs more items than fit in max_tokens
(`minItems`), so every sequence stays under the grammar for all its tokens (no early stop, the mask
is computed for every token). Free run: the same prompts without a grammar, ignore_eos, the same
token count. The mask time is measured inside the engine (`GrammarMasker.mask`: advancing each
matcher, llguidance's bitmask fill, the host-to-device copy and the unpack) per generated token.

    python benchmarks/structured_output.py                          # CPU or the first GPU, default model
    python benchmarks/structured_output.py --batch-sizes 1,8,32,128 --max-tokens 256 --json-out out.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from common import LLM, SamplingParams  # noqa: E402
from common.default_model import resolve_model  # noqa: E402
from common.runner.grammar import GrammarMasker  # noqa: E402
from common.structured_output import json_schema_grammar  # noqa: E402

ITEMS = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"enum": ["Paris", "Berlin", "Rome", "Madrid"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
SCHEMA = {"type": "array", "items": ITEMS, "minItems": 1000}
QUESTION = "List people as a JSON array of objects with a name, an age and a city."


class MaskTimer:
    """Wraps the engine's GrammarMasker.mask and adds up its wall time (synchronised on CUDA, so
    the host-to-device copy and the unpack are counted)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self._original = GrammarMasker.mask

    def __enter__(self) -> MaskTimer:
        timer, original = self, self._original

        def timed(masker, seqs, vocab_size, device):
            t0 = time.perf_counter()
            out = original(masker, seqs, vocab_size, device)
            if out is not None and out.is_cuda:
                torch.cuda.synchronize()
            timer.seconds += time.perf_counter() - t0
            timer.calls += out is not None
            return out

        GrammarMasker.mask = timed  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc) -> None:
        GrammarMasker.mask = self._original  # type: ignore[method-assign]


def run_batch(llm: LLM, batch: int, max_tokens: int, grammar: str | None) -> dict:
    prompt = llm.tokenizer.apply_chat_template(
        [{"role": "user", "content": QUESTION}], tokenize=False, add_generation_prompt=True
    )
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=grammar is None, grammar=grammar)
    with MaskTimer() as timer:
        t0 = time.perf_counter()
        outs = llm.generate([prompt] * batch, params, use_tqdm=False)
        wall = time.perf_counter() - t0
    tokens = sum(len(o["token_ids"]) for o in outs)
    return {
        "batch": batch,
        "tokens": tokens,
        "wall_s": round(wall, 3),
        "tok_s": round(tokens / wall, 1),
        "mask_steps": timer.calls,
        "mask_us_per_token": round(1e6 * timer.seconds / tokens, 1) if grammar else 0.0,
        "mask_ms_per_step": round(1e3 * timer.seconds / max(timer.calls, 1), 3) if grammar else 0.0,
    }


def machine() -> dict:
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    return {
        "cpu": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "gpu": gpu,
        "commit": commit,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="HF model directory (default: the prepared default model)")
    p.add_argument("--batch-sizes", default="1,8", help="comma list of concurrent sequences")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--engine-kwargs", default="{}", help="JSON of extra EngineConfig fields")
    p.add_argument("--json-out", default=None)
    args = p.parse_args()
    llm = LLM(resolve_model(args.model), max_model_len=2048, **json.loads(args.engine_kwargs))
    grammar = json_schema_grammar(SCHEMA)
    run_batch(llm, 2, 8, grammar)  # warm-up: the llguidance tokenizer, first compiles
    rows = []
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        free = run_batch(llm, batch, args.max_tokens, None)
        guided = run_batch(llm, batch, args.max_tokens, grammar)
        slowdown = 100.0 * (1 - guided["tok_s"] / free["tok_s"])
        rows.append(
            {"batch": batch, "free": free, "grammar": guided, "throughput_loss_pct": round(slowdown, 1)}
        )
        print(
            f"batch {batch:4d}: free {free['tok_s']:8.1f} tok/s, grammar {guided['tok_s']:8.1f} tok/s "
            f"({slowdown:+.1f}% slower), mask {guided['mask_us_per_token']:.1f} us/token, "
            f"{guided['mask_ms_per_step']:.3f} ms/step"
        )
    result = {"machine": machine(), "max_tokens": args.max_tokens, "rows": rows}
    print(json.dumps(result["machine"]))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
