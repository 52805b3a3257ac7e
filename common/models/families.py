"""The registered architectures: thin subclasses of the shared decoder setting each family's flags."""

from __future__ import annotations

from common.models.decoder import DecoderForCausalLM


class LlamaForCausalLM(DecoderForCausalLM):
    """Llama 2/3 (rope scaling from config) and Llama-architecture models such as SmolLM2."""


class Qwen2ForCausalLM(DecoderForCausalLM):
    qkv_bias = True


class Qwen3ForCausalLM(DecoderForCausalLM):
    qk_norm = True
