"""The rule that stops capturing share graphs before they take the room an eager chunk needs."""

from __future__ import annotations

from common.config import EngineConfig
from common.model_config import ModelConfig
from common.multiplex.launch_knobs import share_set_fits
from common.runner.kv_cache import activation_reserve
from common.tools.random_model import PRESETS

GIB = 1 << 30


def test_a_set_is_captured_only_while_an_eager_chunk_keeps_its_room():
    assert share_set_fits(free_bytes=5 * GIB, set_bytes=GIB, keep_free=2 * GIB)
    assert share_set_fits(free_bytes=3 * GIB, set_bytes=GIB, keep_free=2 * GIB)  # exactly the room left
    assert not share_set_fits(free_bytes=3 * GIB - 1, set_bytes=GIB, keep_free=2 * GIB)
    assert not share_set_fits(free_bytes=GIB // 2, set_bytes=0, keep_free=GIB)  # no set yet, no room


def test_the_h100_8b_case_keeps_room_for_an_eager_chunk(tiny_model_dirs):
    """The Qwen3-8B shape on an 80-GB H100 (2026-12-05): six share sets of ~1.3 GiB took the 7.9 GiB
    left beside the KV cache and every eager chunk ran out of memory; the rule stops while an eager
    chunk's reserve (about 2 GiB for 8,192 tokens of that shape) is still free."""
    eight_b = ModelConfig.from_dict(dict(PRESETS["qwen3-8b"], torch_dtype="bfloat16"))
    config = EngineConfig(model=str(tiny_model_dirs["qwen3"]), max_num_batched_tokens=8192)
    keep = activation_reserve(config, eight_b)
    assert 1.5 * GIB < keep < 3 * GIB
    free, captured = int(6.2 * GIB), 0
    while share_set_fits(free, int(1.3 * GIB), keep):
        free -= int(1.3 * GIB)
        captured += 1
    assert 0 < captured < 6 and free >= keep
