"""Writes an HF-format model directory with fixed-seed random weights (no download needed).

GPU benchmarks and tests use it to build, e.g., Qwen3-0.6B-architecture weights on a machine
without a model hub, then load them through the normal safetensors path.

    python -m common.tools.random_model --preset qwen3-0.6b --out /tmp/qwen3-0.6b
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from common.wire.detokenizer import REPLACEMENT_CHAR

PRESETS: dict[str, dict] = {
    "qwen3-0.6b": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 1024,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 3072,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "bos_token_id": 151643,
        "eos_token_id": 151645,
    },
    # 8B-class shapes (issue 27): the sizes users serve. About 16 GB of bf16 weights each; writing one
    # takes a minute or more of CPU time and that much RAM.
    "qwen3-8b": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 4096,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 12288,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "bos_token_id": 151643,
        "eos_token_id": 151645,
    },
    "llama-3-8b": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "bos_token_id": 128000,
        "eos_token_id": 128001,
    },
    "smollm2-135m": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 576,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "intermediate_size": 1536,
        "vocab_size": 49152,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
}

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
)


def tensor_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Checkpoint tensor names and shapes of a Llama/Qwen2/Qwen3-style decoder."""
    h, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    qwen2 = cfg["architectures"][0] == "Qwen2ForCausalLM"
    qwen3 = cfg["architectures"][0] == "Qwen3ForCausalLM"
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        }
        if qwen2 or cfg.get("attention_bias"):
            shapes |= {
                p + "self_attn.q_proj.bias": (q,),
                p + "self_attn.k_proj.bias": (kv,),
                p + "self_attn.v_proj.bias": (kv,),
            }
        if qwen3:
            shapes |= {p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)}
    if not cfg.get("tie_word_embeddings"):
        shapes["lm_head.weight"] = (vocab, h)
    return shapes


def write_random_model(
    out: str | Path,
    preset: str = "qwen3-0.6b",
    seed: int = 0,
    dtype: str = "bfloat16",
    tokenizer_from: str | None = None,
    device: str = "cpu",
) -> Path:
    """Write the preset's config and fixed-seed weights; optionally copy a tokenizer in (e.g. the
    default model's, so the router can serve the random model), its vocabulary covered up to the
    preset's (`cover_vocabulary`) and its partial-text ids never chosen greedily (`silence_ids`).
    `device="cuda"` draws the weights on the GPU: an 8B shape then takes seconds instead of the
    CPU's minute or more (the values differ from the CPU's for the same seed, still fixed per device)."""
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {preset!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = dict(PRESETS[preset], torch_dtype=dtype)
    silenced: list[int] = []
    if tokenizer_from is not None:
        for name in TOKENIZER_FILES:
            if (Path(tokenizer_from) / name).is_file():
                shutil.copy(Path(tokenizer_from) / name, out / name)
        if (out / "tokenizer.json").is_file():
            cover_vocabulary(out / "tokenizer.json", cfg["vocab_size"])
            silenced = partial_text_ids(out / "tokenizer.json")
    gen = torch.Generator(device=device).manual_seed(seed)
    torch_dtype = getattr(torch, dtype)
    tensors = {}
    for name, shape in tensor_shapes(cfg).items():
        if len(shape) == 1:  # norms near 1, biases near 0
            base = 0.0 if name.endswith("bias") else 1.0
            t = base + 0.02 * torch.randn(shape, generator=gen, device=device)
        else:
            t = torch.randn(shape, generator=gen, device=device) * (0.5 / shape[1] ** 0.5)
        tensors[name] = t.to(torch_dtype).cpu().contiguous()
    silence_ids(tensors, cfg, silenced)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


def partial_text_ids(tokenizer_json: str | Path) -> list[int]:
    """Ids whose own text is an incomplete UTF-8 sequence (byte-level tokens of a multi-byte
    character): the detokenizer streams nothing after one until a later token completes it."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    size = tok.get_vocab_size(with_added_tokens=True)
    texts = tok.decode_batch([[i] for i in range(size)], skip_special_tokens=False)
    return [i for i, text in enumerate(texts) if REPLACEMENT_CHAR in text]


def silence_ids(tensors: dict[str, torch.Tensor], cfg: dict, ids: list[int]) -> None:
    """Zero the output-head rows of `ids`, so their logit is 0 while the best of ~10^5 random logits
    is well above it: greedy decoding never picks them. Why: a random-weight greedy request often
    settles on one id, and one of the `partial_text_ids` then streams no text to the request's end
    (lone gaps of 0.9-2.3 s in the 8B shape's served runs of 2026-12-04). Tied models lose those
    ids' input embeddings too (prompts of random ids rarely hold them)."""
    if not ids:
        return
    head = "model.embed_tokens.weight" if cfg.get("tie_word_embeddings") else "lm_head.weight"
    tensors[head][torch.tensor(ids, dtype=torch.long)] = 0


def uncovered_ids(model_dir: str | Path) -> int:
    """How many ids of the model's vocabulary (config.json's `vocab_size`) its tokenizer lacks: each
    streams no text when sampled (see `cover_vocabulary`)."""
    from tokenizers import Tokenizer

    model = Path(model_dir)
    vocab = json.loads((model / "config.json").read_text()).get("vocab_size") or 0
    have = Tokenizer.from_file(str(model / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
    return max(vocab - have, 0)


def cover_vocabulary(tokenizer_json: str | Path, vocab_size: int) -> int:
    """Give every id below `vocab_size` that the tokenizer lacks a plain token `<id:N>`; returns how many
    were added (0 when it covers the vocabulary already).

    Why: a tokenizer borrowed from a smaller vocabulary (the default model's 49,152 ids for a Qwen3 shape's
    151,936) decodes the ids it lacks to no text at all, and a random-weight model's greedy output often
    settles on one id: when that id is one it lacks, the request streams no text until it ends, and the
    client's inter-token gaps and TTFT measure that instead of the server (the 8B-shape serving runs of
    2026-12-04 showed 1.6-2.2 s gaps: a whole request's decode). Prompts of token ids are unaffected."""
    from tokenizers import AddedToken, Tokenizer

    path = Path(tokenizer_json)
    tok = Tokenizer.from_file(str(path))
    have = tok.get_vocab_size(with_added_tokens=True)
    if have >= vocab_size:
        return 0
    added = tok.add_tokens(
        [AddedToken(f"<id:{i}>", special=False, normalized=False) for i in range(have, vocab_size)]
    )
    for i in (have, vocab_size - 1):  # ids are given in order from the tokenizer's size: check both ends
        if tok.token_to_id(f"<id:{i}>") != i:
            raise ValueError(f"tokenizer {path}: cannot give id {i} a token (its ids are not contiguous)")
    tok.save(str(path), pretty=False)
    return added


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="qwen3-0.6b", choices=sorted(PRESETS))
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument(
        "--tokenizer-from",
        default=None,
        help="copy tokenizer files from this model dir (ids it lacks get plain tokens <id:N>)",
    )
    parser.add_argument("--device", default="cpu", help="where to draw weights (cuda: fast)")
    args = parser.parse_args()
    print(write_random_model(args.out, args.preset, args.seed, args.dtype, args.tokenizer_from, args.device))


if __name__ == "__main__":
    main()
