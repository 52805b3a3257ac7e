"""What structured output costs per token: the grammar mask's host time, and decode throughput with
and without a grammar for exactly the same work.

1. Mask micro-benchmark: `GrammarMasker.mask` (advance the matcher, llguidance's bitmask fill, the copy
   to the device, the unpack with torch ops) driven over a fixed JSON answer, token by token, for
   `--batch-sizes` rows at once; reported per row and token (p50 and mean).
2. Engine: `--batch-sizes` copies of one chat prompt, greedy, under a JSON schema (an array of small
   objects), at most `--max-tokens` tokens each. Then the same prompts without a grammar, ignore_eos,
   each sequence's max_tokens set to the length its grammar run produced: both runs generate exactly
   the same number of tokens per sequence, so the throughput difference is the grammar's cost. The
   mask time inside the engine is measured too (synchronised on CUDA).

    python benchmarks/engine/structured_output.py                  # CPU or the first GPU, default model
    python benchmarks/engine/structured_output.py --batch-sizes 1,8,32,128 --max-tokens 256 \
        --json-out out.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from common import LLM, SamplingParams  # noqa: E402
from common.core.sequence import Sequence  # noqa: E402
from common.runner.grammar import GrammarMasker  # noqa: E402
from common.tools.default_model import resolve_model  # noqa: E402
from common.wire.structured_output import json_schema_grammar  # noqa: E402

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
SCHEMA = {"type": "array", "items": ITEMS}
ANSWER = json.dumps(
    [{"name": "Alice", "age": 30, "city": "Paris"}, {"name": "Bob", "age": 41, "city": "Rome"}] * 4
)
QUESTION = "List people as a JSON array of objects with a name, an age and a city."


class MaskTimer:
    """Wraps the engine's GrammarMasker.mask and adds up its wall time and the grammar rows it masked."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.rows = 0
        self._original = GrammarMasker.mask

    def __enter__(self) -> MaskTimer:
        timer, original = self, self._original

        def timed(masker, seqs, vocab_size, device):
            t0 = time.perf_counter()
            out = original(masker, seqs, vocab_size, device)
            if out is not None and out.is_cuda:
                torch.cuda.synchronize()
            timer.seconds += time.perf_counter() - t0
            timer.rows += sum(s.sampling_params.grammar is not None for s in seqs)
            return out

        GrammarMasker.mask = timed  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc) -> None:
        GrammarMasker.mask = self._original  # type: ignore[method-assign]


def mask_microbench(llm: LLM, batch: int) -> dict:
    """Per row and token: the mask of `batch` sequences that all follow ANSWER under SCHEMA."""
    runner = llm.engine.runner
    masker, vocab, device = runner.grammar, runner.model_config.vocab_size, runner.device
    answer = masker.tokenizer(vocab).tokenize_str(ANSWER)
    grammar = json_schema_grammar(SCHEMA)
    seqs = [Sequence([1, 2, 3], SamplingParams(grammar=grammar), 16) for _ in range(batch)]
    times = []
    for token in answer:
        t0 = time.perf_counter()
        masker.mask(seqs, vocab, device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / batch)
        for seq in seqs:
            seq.append_token(token)
    return {
        "batch": batch,
        "tokens": len(answer),
        "p50_us": round(1e6 * statistics.median(times), 1),
        "mean_us": round(1e6 * statistics.fmean(times), 1),
    }


def run_batch(llm: LLM, prompt: str, params: list[SamplingParams]) -> dict:
    with MaskTimer() as timer:
        t0 = time.perf_counter()
        outs = llm.generate([prompt] * len(params), params, use_tqdm=False)
        wall = time.perf_counter() - t0
    tokens = sum(len(o["token_ids"]) for o in outs)
    return {
        "lengths": [len(o["token_ids"]) for o in outs],
        "tokens": tokens,
        "wall_s": round(wall, 3),
        "tok_s": round(tokens / wall, 1),
        "mask_s": round(timer.seconds, 4),
        "mask_us_per_row": round(1e6 * timer.seconds / timer.rows, 1) if timer.rows else 0.0,
    }


def engine_pair(llm: LLM, batch: int, max_tokens: int) -> dict:
    prompt = llm.tokenizer.apply_chat_template(
        [{"role": "user", "content": QUESTION}], tokenize=False, add_generation_prompt=True
    )
    grammar = json_schema_grammar(SCHEMA)
    guided = run_batch(
        llm, prompt, [SamplingParams(temperature=0, max_tokens=max_tokens, grammar=grammar)] * batch
    )
    free_params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in guided["lengths"]]
    free = run_batch(llm, prompt, free_params)
    loss = 100.0 * (1 - guided["tok_s"] / free["tok_s"])
    return {"batch": batch, "free": free, "grammar": guided, "throughput_loss_pct": round(loss, 1)}


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
    p.add_argument("--skip-engine", action="store_true", help="the mask micro-benchmark only")
    p.add_argument("--json-out", default=None)
    args = p.parse_args()
    batches = [int(b) for b in args.batch_sizes.split(",")]
    llm = LLM(resolve_model(args.model), max_model_len=2048, **json.loads(args.engine_kwargs))
    mask_microbench(llm, 1)  # warm-up: the llguidance tokenizer, first compiles
    micro = [mask_microbench(llm, b) for b in batches]
    for m in micro:
        print(f"mask, {m['batch']:4d} rows: {m['p50_us']:8.1f} us/row/token p50, {m['mean_us']:8.1f} mean")
    rows = [] if args.skip_engine else [engine_pair(llm, b, args.max_tokens) for b in batches]
    for r in rows:
        free, guided = r["free"], r["grammar"]
        print(
            f"engine, batch {r['batch']:4d}: free {free['tok_s']:8.1f} tok/s, grammar {guided['tok_s']:8.1f} "
            f"tok/s ({r['throughput_loss_pct']:+.1f}%), {guided['tokens']} tokens each, "
            f"mask {guided['mask_us_per_row']:.1f} us/row in the engine"
        )
    result = {"machine": machine(), "max_tokens": args.max_tokens, "mask": micro, "engine": rows}
    print(json.dumps(result["machine"]))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
