"""bf16 on the CPU (bf16 weights and KV cache, oneDNN-packed projections, attention widened to float32)
stays within bf16 tolerance of transformers: the engine's log-probabilities, teacher-forced along its
own greedy output, are no further from transformers' float32 ones than transformers' own bf16 run is."""

from __future__ import annotations

import torch

from common import LLM, SamplingParams
from common.tools.default_model import prepare_default_model

QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea."]
NEW_TOKENS, TOP = 12, 5


def _hf_logprobs(model_dir: str, dtype: torch.dtype, ids: list[int]) -> torch.Tensor:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    with torch.no_grad():
        return torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)


def test_bf16_logprobs_within_bf16_tolerance_of_transformers():
    model_dir = str(prepare_default_model(progress=False))
    llm = LLM(model_dir, dtype="bfloat16", num_kvcache_blocks=64, max_model_len=512)
    tok = llm.tokenizer
    chats = [[{"role": "user", "content": q}] for q in QUESTIONS]
    prompts = [
        tok.encode(tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True)) for c in chats
    ]
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=TOP)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert "Paris" in outs[0]["text"]
    ours_err, hf_bf16_err = 0.0, 0.0
    for prompt, out in zip(prompts, outs, strict=True):
        full = prompt + out["token_ids"]
        ref = _hf_logprobs(model_dir, torch.float32, full)[len(prompt) - 1 : -1]
        hf_bf16 = _hf_logprobs(model_dir, torch.bfloat16, full)[len(prompt) - 1 : -1]
        for step, lp in enumerate(out["logprobs"]):
            ids = torch.tensor([t for t, _ in lp.top])
            ours = torch.tensor([v for _, v in lp.top])
            ours_err = max(ours_err, (ours - ref[step, ids]).abs().max().item())
            hf_bf16_err = max(hf_bf16_err, (hf_bf16[step, ids] - ref[step, ids]).abs().max().item())
    assert ours_err <= max(2 * hf_bf16_err, 0.05), (ours_err, hf_bf16_err)
