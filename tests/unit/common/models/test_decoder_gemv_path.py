"""The decoder's few-row path through the streaming GEMV (common/layers/triton_gemv.py), on the CPU.

The kernel needs Triton on a GPU (tests/unit/common/layers/test_gemv.py checks it against `F.linear` and
the eager MLP input there). Here the routing is forced on for 1- or 2-row steps and the kernel's contract is
computed with torch, so what is checked is the wiring: which projections take it, with which weight,
bias and SiLU*mul flag. Every token must equal the eager path's, bit for bit (the same torch ops)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from common import LLM, SamplingParams
from common.layers import linear
from common.models import decoder

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
PROMPTS = [[3, 14, 15, 92, 65], [35, 89, 79]]


class _GemvContract:
    """`triton_gemv.gemv`'s contract in torch, recording each call's weight shape and flag."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[int, ...], bool, bool]] = []
        self.rows: set[int] = set()

    def gemv(self, x, weight, bias=None, *, silu_mul=False, launch=None):
        self.calls.append((tuple(weight.shape), silu_mul, bias is not None))
        self.rows.add(x.shape[0])
        out = F.linear(x, weight, bias)
        if not silu_mul:
            return out
        gate, up = out.chunk(2, dim=-1)
        return F.silu(gate) * up


@pytest.mark.parametrize("rows", [1, 2])  # 2: both prompts decode together, in 2-row steps
@pytest.mark.parametrize("arch", ["qwen3", "qwen2"])  # qwen2: q/k/v biases through the GEMV
def test_few_row_steps_through_the_gemv_equal_the_eager_path(tiny_model_dirs, monkeypatch, arch, rows):
    want = LLM(tiny_model_dirs[arch]).generate(PROMPTS, GREEDY, use_tqdm=False)
    contract = _GemvContract()

    def few_rows(x: torch.Tensor, weight_bytes: int) -> bool:
        return x.dim() == 2 and x.shape[0] <= rows

    for module in (linear, decoder):
        monkeypatch.setattr(module, "use_gemv", few_rows)
        monkeypatch.setattr(module, "gemv", lambda: contract)
    llm = LLM(tiny_model_dirs[arch])
    if rows == 1:
        got = [llm.generate([p], GREEDY, use_tqdm=False)[0] for p in PROMPTS]  # batch 1: one-row steps
    else:
        got = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [g["token_ids"] for g in got] == [w["token_ids"] for w in want]
    assert contract.rows == {rows}  # prompts (3 and 5 tokens) take the eager path
    cfg = llm.engine.model_config
    hidden, inter = cfg.hidden_size, cfg.intermediate_size
    qkv = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim
    seen = set(contract.calls)
    assert ((2 * inter, hidden), True, False) in seen  # gate/up with SiLU*mul inside
    assert ((hidden, inter), False, False) in seen  # down
    assert ((hidden, cfg.num_attention_heads * cfg.head_dim), False, False) in seen  # o_proj
    assert ((qkv, hidden), False, arch == "qwen2") in seen
