"""Tiny random HF checkpoints (fixed seed, saved as safetensors) and transformers' greedy answers on them.

Shared by the tests and the CPU benchmarks (benchmarks/ imports no test code), hence here."""

from __future__ import annotations

import inspect
from pathlib import Path

import torch

TINY_COMMON = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    rms_norm_eps=1e-6,
)


def _config(arch: str, **overrides):
    import transformers

    kw = dict(TINY_COMMON)
    if arch == "qwen3":
        kw.update(head_dim=32, rope_theta=1_000_000.0, tie_word_embeddings=True)
        cfg = transformers.Qwen3Config(**kw)
    elif arch == "qwen2":
        kw.update(rope_theta=1_000_000.0, tie_word_embeddings=False)
        cfg = transformers.Qwen2Config(**kw)
    elif arch == "llama":
        kw.update(
            rope_theta=500_000.0,
            tie_word_embeddings=False,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 256,
            },
        )
        cfg = transformers.LlamaConfig(**kw)
    else:
        raise ValueError(f"unknown tiny architecture {arch!r}")
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


def write_tiny_model(arch: str, directory: Path, seed: int = 0, **overrides) -> Path:
    """Create a random model of `arch` ('qwen3', 'qwen2', 'llama') in `directory`; returns it."""
    import transformers

    torch.manual_seed(seed)
    cfg = _config(arch, **overrides)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    # Larger-than-default weights make the logits peaked, so greedy ties (and flaky parity) are rare.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                # Tied embeddings double as the LM head, where a large scale makes outputs repeat.
                embed_std = 0.4 if cfg.tie_word_embeddings else 1.0
                p.normal_(0.0, embed_std if "embed" in name else 0.15)
            elif "bias" in name:
                p.normal_(0.0, 0.1)
    model.save_pretrained(directory, safe_serialization=True)
    return directory


def hf_greedy(
    model_dir: Path,
    prompts: list[list[int]],
    max_new_tokens: int,
    use_cache: bool = False,
    logit_bias: dict[int, float] | None = None,
) -> list[list[int]]:
    """Reference greedy continuations from transformers (fp32, one prompt at a time, EOS not special).

    A plain argmax loop over the model's forward, so no generation-config logic (EOS handling,
    min_new_tokens bans) can differ from the engine's `ignore_eos` greedy. By default each step runs
    the full sequence (no cache: the reference for random tiny models, whose near-ties the slightly
    different sums of a cached step could flip); `use_cache` feeds back whatever cache the model
    returned (for real models, where a full forward per token costs minutes on the CPU).
    `logit_bias` (token id -> bias) is added to each step's logits before the argmax: OpenAI's rule.
    """
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    # transformers 5.x renamed the cache argument and output field `past_key_values` -> `cache`
    cache_name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    outs = []
    for ids in prompts:
        seq, past, feed = list(ids), None, list(ids)
        with torch.no_grad():
            for _ in range(max_new_tokens):
                if use_cache:
                    out = model(input_ids=torch.tensor([feed]), use_cache=True, **{cache_name: past})
                    past = getattr(out, cache_name)
                else:
                    out = model(input_ids=torch.tensor([seq]), use_cache=False)
                logits = out.logits[0, -1]
                if logit_bias:
                    logits = logits.clone()
                    for token, bias in logit_bias.items():
                        logits[token] += bias
                seq.append(int(logits.argmax()))
                feed = seq[-1:]
        outs.append(seq[len(ids) :])
    return outs
