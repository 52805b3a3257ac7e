"""Where float32 greedy outputs of the engine part ways, on the GPU: one factor at a time.

    python benchmarks/engine/fp32_parity.py [--model DIR]       (default: the default model)

Six short chat prompts, greedy, 64 tokens, float32. The reference is the eager engine running each prompt
alone. Each variant changes one thing the cluster does differently from a plain offline run: CUDA graphs,
all prompts in one batch, a prefix-cache hit (the same prompts a second time), a decode batch padded to
a captured graph size. For each it prints how many of the six outputs are token-identical and, for the
first one that is not, the position and the reference's top-2 logit gap there (a near-tie flipped by
rounding has a gap near 1e-5; a real bug has a large one).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from common import LLM, SamplingParams  # noqa: E402
from common.tools.default_model import resolve_model  # noqa: E402

QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "How many legs does a spider have?",
    "Write a haiku about the sea.",
    "What is 12 times 12?",
    "Give one tip for learning to code.",
]


def chat_prompts(llm: LLM) -> list[list[int]]:
    tok = llm.tokenizer
    return [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
        for q in QUESTIONS
    ]


def run(model: str, prompts, eager: bool, together: bool, repeat: bool) -> list[list[int]]:
    llm = LLM(model, dtype="float32", enforce_eager=eager)
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    if repeat:  # fill the prefix cache first: the measured run then hits it
        llm.generate(prompts, params, use_tqdm=False)
    if together:
        outs = llm.generate(prompts, params, use_tqdm=False)
    else:
        outs = [llm.generate([p], params, use_tqdm=False)[0] for p in prompts]
    llm.close() if hasattr(llm, "close") else None
    return [o["token_ids"] for o in outs]


def top2_gap(model: str, prompt: list[int], prefix: list[int]) -> float:
    """The reference's logit gap between its top two tokens after prompt + prefix (eager, alone)."""
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).cuda().eval()
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + prefix], device="cuda")).logits[0, -1]
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    a = p.parse_args()
    model = resolve_model(a.model)
    prompts = chat_prompts(LLM(model, dtype="float32", enforce_eager=True, num_kvcache_blocks=64))
    ref = run(model, prompts, eager=True, together=False, repeat=False)
    variants = {
        "eager, one batch": dict(eager=True, together=True, repeat=False),
        "eager, prefix hit": dict(eager=True, together=False, repeat=True),
        "graphs, alone": dict(eager=False, together=False, repeat=False),
        "graphs, one batch": dict(eager=False, together=True, repeat=False),
        "graphs, one batch, prefix hit": dict(eager=False, together=True, repeat=True),
    }
    print(f"{'variant':<32} identical  first divergence (prompt, position, reference top-2 gap)")
    for name, kw in variants.items():
        got = run(model, prompts, **kw)
        same = [g == r for g, r in zip(got, ref, strict=True)]
        note = ""
        if not all(same):
            i = same.index(False)
            pos = next(k for k, (x, y) in enumerate(zip(got[i], ref[i], strict=False)) if x != y)
            note = f"prompt {i}, token {pos}, gap {top2_gap(model, prompts[i], ref[i][:pos]):.2e}"
        print(f"{name:<32} {sum(same)}/6        {note}", flush=True)


if __name__ == "__main__":
    main()
