"""llguidance against xgrammar on the default model's tokenizer: tokenizer set-up, grammar compile and
the token mask per step, over one JSON answer (the measurement behind the library choice in
docs/architecture.md). xgrammar is not a project dependency: `pip install xgrammar` first (it pulls in
triton; uninstall it afterwards on a CPU box).

    python benchmarks/engine/grammar_libraries.py
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import llguidance  # noqa: E402
import llguidance.hf  # noqa: E402
import llguidance.torch  # noqa: E402
import torch  # noqa: E402

from common.model_config import ModelConfig  # noqa: E402
from common.tokenizer import load_tokenizer  # noqa: E402
from common.tools.default_model import prepare_default_model  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "tags"],
}
ANSWER = json.dumps({"name": "Alice Smith", "age": 31, "tags": ["a", "bb", "ccc", "engineer"]})


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def report(name: str, setup_s: float, compile_s: float, masks: list[float]) -> None:
    print(
        f"{name:11s} tokenizer {setup_s:.3f} s, grammar {1e3 * compile_s:.2f} ms, mask per token: "
        f"median {1e6 * statistics.median(masks):.1f} us, mean {1e6 * statistics.fmean(masks):.1f} us, "
        f"max {1e6 * max(masks):.1f} us"
    )


def bench_llguidance(hf, vocab: int, ids: list[int]) -> None:
    tok, setup_s = timed(lambda: llguidance.hf.from_tokenizer(hf, n_vocab=vocab))
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA)
    matcher, compile_s = timed(lambda: llguidance.LLMatcher(tok, grammar))
    bits = torch.full((1, (vocab + 31) // 32), -1, dtype=torch.int32)
    masks = []
    for t in ids:
        masks.append(timed(lambda: llguidance.torch.fill_next_token_bitmask(matcher, bits, 0))[1])
        if not matcher.consume_token(t):
            raise RuntimeError(matcher.get_error())
    report("llguidance", setup_s, compile_s, masks)


def bench_xgrammar(hf, vocab: int, ids: list[int]) -> None:
    try:
        import xgrammar as xgr
    except ImportError:
        print("xgrammar    not installed (pip install xgrammar)")
        return
    compiler, setup_s = timed(
        lambda: xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab))
    )
    compiled, compile_s = timed(lambda: compiler.compile_json_schema(json.dumps(SCHEMA)))
    matcher = xgr.GrammarMatcher(compiled)
    bits = xgr.allocate_token_bitmask(1, vocab)
    masks = []
    for t in ids:
        masks.append(timed(lambda: matcher.fill_next_token_bitmask(bits, 0))[1])
        if not matcher.accept_token(t):
            raise RuntimeError(f"xgrammar refused token {t}")
    report("xgrammar", setup_s, compile_s, masks)


def main() -> None:
    model_dir = prepare_default_model(progress=False)
    hf = load_tokenizer(model_dir)
    vocab = ModelConfig.from_dir(model_dir).vocab_size
    ids = hf.encode(ANSWER)
    print(f"{len(ids)} tokens, vocabulary {vocab}, {torch.get_num_threads()} threads")
    bench_llguidance(hf, vocab, ids)
    bench_xgrammar(hf, vocab, ids)


if __name__ == "__main__":
    main()
