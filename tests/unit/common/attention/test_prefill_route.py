"""Which kernel a prefill step takes, and how `varlen_attn` is called on each PyTorch's signature.

Pure functions on the CPU: the FlashAttention call itself is checked on the GPU
(test_varlen_prefill.py).
"""

from __future__ import annotations

import pytest
import torch

from common.attention.varlen_prefill import (
    PrefillKernel,
    find_varlen_api,
    has_cached_prefix,
    read_varlen_api,
    route,
)

VARLEN, PAGED = PrefillKernel.VARLEN, PrefillKernel.PAGED
HEAD_DIM = 128
SCALE = HEAD_DIM**-0.5


# The public signatures `varlen_attn` has had, as far as the call is concerned.
def _window_signature(
    query,
    key,
    value,
    cu_seq_q,
    cu_seq_k,
    max_q,
    max_k,
    *,
    return_aux=None,
    scale=None,
    window_size=(-1, -1),
    enable_gqa=False,
    seqused_k=None,
    block_table=None,
    num_splits=None,
):
    raise AssertionError("only the signature is read")


def _window_no_gqa_signature(
    query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None, window_size=(-1, -1)
):
    raise AssertionError("only the signature is read")


def _is_causal_signature(
    query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None
):
    raise AssertionError("only the signature is read")


def _no_causal_signature(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k):
    raise AssertionError("only the signature is read")


WINDOW = read_varlen_api(_window_signature)
OLD = read_varlen_api(_is_causal_signature)


def test_this_pytorchs_varlen_attn_is_understood():
    varlen = pytest.importorskip("torch.nn.attention.varlen")
    api = read_varlen_api(varlen.varlen_attn)
    assert api is not None and api.fn is varlen.varlen_attn
    assert api.kwargs(SCALE, gqa=True).get("window_size", (-1, 0)) == (-1, 0)


def test_each_signature_gets_a_causal_call_it_accepts():
    assert WINDOW is not None and OLD is not None
    assert WINDOW.kwargs(0.1, gqa=True) == {"window_size": (-1, 0), "scale": 0.1, "enable_gqa": True}
    assert WINDOW.kwargs(0.1, gqa=False) == {"window_size": (-1, 0), "scale": 0.1}
    no_gqa = read_varlen_api(_window_no_gqa_signature)
    assert no_gqa is not None and no_gqa.kwargs(0.1, gqa=True) == {"window_size": (-1, 0), "scale": 0.1}
    assert OLD.kwargs(0.1, gqa=True) == {"is_causal": True}  # no scale: only routed at the default one
    assert read_varlen_api(_no_causal_signature) is None
    assert read_varlen_api(None) is None


def test_no_cuda_means_no_varlen():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert find_varlen_api() is None


@pytest.mark.parametrize(
    ("starts", "seq_lens", "cached"),
    [
        ([0, 5], [5], False),
        ([0, 3, 10, 2058], [3, 7, 2048], False),
        ([0, 5], [9], True),  # one chunk over a 4-token prefix
        ([0, 3, 10], [3, 8], True),  # only the second sequence has a prefix
        ([0, 1, 2], [40, 70], True),  # decode-like rows
    ],
)
def test_cached_prefix_is_seen_in_any_sequence(starts, seq_lens, cached):
    assert has_cached_prefix(starts, seq_lens) is cached


def _route(api=WINDOW, dtype=torch.bfloat16, head_dim=HEAD_DIM, scale=SCALE, starts=(0, 7, 40), lens=(7, 33)):
    return route(api, dtype, head_dim, scale, None if starts is None else list(starts), lens and list(lens))


def test_fresh_half_precision_prompts_take_flash_attention():
    assert _route() is VARLEN
    assert _route(dtype=torch.float16) is VARLEN
    assert _route(head_dim=64, scale=64**-0.5) is VARLEN
    assert _route(api=OLD) is VARLEN  # the old API's default scale is the model's


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"api": None}, "no varlen_attn in this PyTorch"),
        ({"dtype": torch.float32}, "FlashAttention is fp16/bf16 only: fp32 stays on Triton"),
        ({"head_dim": 100, "scale": 0.1}, "head size not a multiple of 8"),
        ({"head_dim": 512, "scale": 0.1}, "head size over 256"),
        ({"api": OLD, "scale": 0.1}, "a scale the old API cannot take"),
        ({"starts": (0, 7, 40), "lens": (7, 40)}, "a prefix-cache hit / chunked prefill"),
        ({"starts": None}, "no host copy of the lengths"),
    ],
)
def test_everything_else_stays_on_the_paged_triton_kernel(change, why):
    assert _route(**change) is PAGED, why
