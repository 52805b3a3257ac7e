"""The decoder-only transformer shared by the Llama, Qwen2 and Qwen3 families.

The families differ only in flags: Qwen2 has a bias on the q/k/v projections, Qwen3 normalises q and
k per head (RMSNorm) before the rotary embedding, Llama 3 scales rotary frequencies.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from common.layers.activation import SiluAndMul
from common.layers.attention import Attention
from common.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from common.layers.fused import gemv, skinny, use_fused, use_gemv, use_skinny
from common.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from common.layers.norm import RMSNorm
from common.layers.rotary import RotaryEmbedding
from common.model_config import ModelConfig


class DecoderAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, qkv_bias: bool, qk_norm: bool) -> None:
        super().__init__()
        hd = cfg.head_dim
        self.qkv_proj = QKVParallelLinear(
            cfg.hidden_size, hd, cfg.num_attention_heads, cfg.num_key_value_heads, bias=qkv_bias
        )
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.q_size, self.kv_size, self.head_dim = self.num_heads * hd, self.num_kv_heads * hd, hd
        self.o_proj = RowParallelLinear(cfg.num_attention_heads * hd, cfg.hidden_size, bias=False)
        self.rotary_emb = RotaryEmbedding(hd, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps) if qk_norm else None
        self.attn = Attention(self.num_heads, hd, hd**-0.5, self.num_kv_heads)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return self.attend(positions, self.qkv_proj(hidden))

    def attend(self, positions: torch.Tensor, qkv: torch.Tensor) -> torch.Tensor:
        """Attention and the output projection, from the fused q/k/v projection's output."""
        if use_fused(qkv) and self.head_dim & (self.head_dim - 1) == 0:  # kernels tile a power-of-2 half
            out = self.attn.forward_qkv_fused(qkv, positions, self.rotary_emb, self.q_norm, self.k_norm)
            return self.o_proj(out.reshape(-1, self.q_size))
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(-1, self.num_heads, self.head_dim)
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        v = v.reshape(-1, self.num_kv_heads, self.head_dim)
        q, k = self.rotary_emb.forward_with_norm(positions, q, k, self.q_norm, self.k_norm)
        out = self.attn(q, k, v)
        return self.o_proj(out.reshape(-1, self.q_size))


class DecoderMLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.hidden_act != "silu":
            raise ValueError(f"hidden_act {cfg.hidden_act!r} is not supported (only 'silu')")
        size = cfg.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(cfg.hidden_size, [size, size], bias=False)
        self.down_proj = RowParallelLinear(size, cfg.hidden_size, bias=False)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj.weight
        if use_gemv(x, gate_up.nbytes):  # a few rows: SiLU*mul inside the projection
            return self.down_proj(gemv().gemv(x, gate_up, silu_mul=True))
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, qkv_bias: bool, qk_norm: bool) -> None:
        super().__init__()
        self.self_attn = DecoderAttention(cfg, qkv_bias, qk_norm)
        self.mlp = DecoderMLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if use_skinny(hidden, self.mlp.gate_up_proj.weight.nbytes):
            return self._forward_skinny(positions, hidden, residual)
        if residual is None:
            hidden, residual = self.input_layernorm(hidden), hidden
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual

    def _forward_skinny(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode-sized steps on CUDA: each norm runs inside the projection after it, and SiLU*mul
        inside the gate/up projection (common/layers/triton_skinny.py): 4 kernels fewer per layer."""
        attn, mlp = self.self_attn, self.mlp
        qkv, residual = _norm_project(self.input_layernorm, attn.qkv_proj, hidden, residual)
        hidden = attn.attend(positions, qkv)
        act, residual = _norm_project(self.post_attention_layernorm, mlp.gate_up_proj, hidden, residual, True)
        return mlp.down_proj(act), residual


def _norm_project(
    norm: RMSNorm, proj: nn.Module, x: torch.Tensor, residual: torch.Tensor | None, silu_mul: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """proj(norm(x + residual)) [then SiLU(gate) * up] and the new residual, as one skinny kernel."""
    out = skinny().skinny_linear(
        x,
        proj.weight,
        proj.bias,
        residual=residual,
        norm_weight=norm.weight,
        eps=norm.eps,
        silu_mul=silu_mul,
    )
    return (out, x) if residual is None else out


class DecoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig, qkv_bias: bool, qk_norm: bool) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, qkv_bias, qk_norm) for _ in range(cfg.num_hidden_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        *_, hidden = self.forward_in_parts(input_ids, positions, len(self.layers))  # one part
        return hidden

    def forward_in_parts(
        self, input_ids: torch.Tensor, positions: torch.Tensor, layers_per_part: int
    ) -> Iterator[torch.Tensor | None]:
        """The same forward pass, launched `layers_per_part` layers at a time: yields None after each
        part but the last, then the final hidden states (the caller may do other work in between)."""
        hidden, residual = self.embed_tokens(input_ids), None
        for i, layer in enumerate(self.layers, start=1):
            hidden, residual = layer(positions, hidden, residual)
            if i % layers_per_part == 0 and i < len(self.layers):
                yield None
        hidden, _ = self.norm(hidden, residual)
        yield hidden


class DecoderForCausalLM(nn.Module):
    """Base of every registered architecture; subclasses set the family's flags."""

    qkv_bias: bool = False
    qk_norm: bool = False
    # Checkpoint name fragment -> (our parameter fragment, shard id) for merged projections.
    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = DecoderModel(cfg, self.bias_for(cfg), self.qk_norm)
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @classmethod
    def bias_for(cls, cfg: ModelConfig) -> bool:
        return cls.qkv_bias or cfg.attention_bias

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def forward_in_parts(
        self, input_ids: torch.Tensor, positions: torch.Tensor, layers_per_part: int
    ) -> Iterator[torch.Tensor | None]:
        return self.model.forward_in_parts(input_ids, positions, layers_per_part)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
