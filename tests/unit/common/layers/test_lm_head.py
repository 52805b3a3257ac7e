"""The LM head's projection rule (common/layers/fused.py `use_lm_head_gemv`): 8B-class heads take the
streaming GEMV in one-row steps and agree with `F.linear`; small heads and larger steps stay on cuBLAS."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from common.layers.embedding import ParallelLMHead
from common.layers.fused import LM_HEAD_GEMV_MIN_BYTES, use_lm_head_gemv


def test_the_cpu_never_takes_the_gemv():
    x = torch.zeros(1, 8)
    assert not use_lm_head_gemv(x, LM_HEAD_GEMV_MIN_BYTES)


def _head(vocab: int, hidden: int) -> ParallelLMHead:
    head = ParallelLMHead(vocab, hidden).to(device="cuda", dtype=torch.bfloat16)
    head.weight.data.normal_(0, hidden**-0.5)
    return head


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_an_8b_class_head_takes_the_gemv_at_one_row_and_agrees_with_linear():
    torch.manual_seed(0)
    head = _head(151_936, 2048)  # 622 MB: over the line
    x = torch.randn(1, 2048, device="cuda", dtype=torch.bfloat16)
    assert use_lm_head_gemv(x, head.weight.nbytes)
    torch.testing.assert_close(head(x), F.linear(x, head.weight), atol=3e-2, rtol=3e-2)
    many = torch.randn(64, 2048, device="cuda", dtype=torch.bfloat16)
    assert not use_lm_head_gemv(many, head.weight.nbytes)
    torch.testing.assert_close(head(many), F.linear(many, head.weight), atol=0, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_small_head_stays_on_cublas():
    head = _head(49_152, 576)  # the default model's tied head, 56 MB
    x = torch.randn(1, 576, device="cuda", dtype=torch.bfloat16)
    assert not use_lm_head_gemv(x, head.weight.nbytes)
    torch.testing.assert_close(head(x), F.linear(x, head.weight), atol=0, rtol=0)
