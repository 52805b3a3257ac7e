"""The rule that stops capturing share graphs before they take the room an eager chunk needs."""

from __future__ import annotations

from common.config import EngineConfig
from common.model_config import ModelConfig
from common.multiplex.launch_knobs import (
    eager_chunk_room,
    graph_floor,
    graph_floor_enabled,
    largest_share_first,
    share_set_fits,
)
from common.multiplex.partitions import InlineLane
from common.runner.kv_cache import activation_reserve
from common.tools.random_model import PRESETS

GIB = 1 << 30


def test_a_set_is_captured_only_while_an_eager_chunk_keeps_its_room():
    assert share_set_fits(free_bytes=5 * GIB, set_bytes=GIB, keep_free=2 * GIB)
    assert share_set_fits(free_bytes=3 * GIB, set_bytes=GIB, keep_free=2 * GIB)  # exactly the room left
    assert not share_set_fits(free_bytes=3 * GIB - 1, set_bytes=GIB, keep_free=2 * GIB)
    assert not share_set_fits(free_bytes=GIB // 2, set_bytes=0, keep_free=GIB)  # no set yet, no room


def test_sets_are_captured_for_the_largest_share_first():
    lanes = [InlineLane(sms=32), InlineLane(sms=112), InlineLane(sms=None), InlineLane(sms=64)]
    assert [lane.sms for lane in largest_share_first(lanes)] == [112, 64, 32]


def test_the_split_floor_is_the_smallest_share_with_graphs_when_smaller_ones_launch_eager():
    lanes = [InlineLane(sms=s) for s in (32, 48, 64, 80, 96, 112, None)]  # the H100's ladder
    assert graph_floor(lanes, lambda sms: sms in (80, 96, 112, None)) == 3  # the 8B shape on 80 GB
    assert graph_floor(lanes, lambda sms: True) == 0  # graphs everywhere (the H200): the whole ladder
    assert graph_floor(lanes, lambda sms: sms is None) == 0  # no share has graphs: every rung is eager
    assert graph_floor([InlineLane(sms=None)], lambda sms: True) == 0  # one lane, the whole device


def test_the_graph_floor_is_on_by_default(monkeypatch):
    monkeypatch.delenv("PDSERVE_MUX_GRAPH_FLOOR", raising=False)
    assert graph_floor_enabled()  # served in session 36 (docs/benchmarks.md)
    monkeypatch.setenv("PDSERVE_MUX_GRAPH_FLOOR", "0")
    assert not graph_floor_enabled()


def test_the_h100_8b_case_keeps_room_for_eager_chunks(tiny_model_dirs):
    """The Qwen3-8B shape on an 80-GB H100 (2026-12-05): with sets of 1.16 GiB captured smallest share
    first until 2.48 GiB stayed free (an eager chunk's reserve being 1.93), the two largest shares ran
    their chunks eager and one ran out of memory (0.68 GiB reserved but unusable). Largest first, with
    half a reserve more kept free, the three largest shares get sets and 3.6 GiB stay free."""
    eight_b = ModelConfig.from_dict(dict(PRESETS["qwen3-8b"], torch_dtype="bfloat16"))
    config = EngineConfig(model=str(tiny_model_dirs["qwen3"]), max_num_batched_tokens=8192)
    reserve = activation_reserve(config, eight_b)
    assert 1.8 * GIB < reserve < 2.0 * GIB
    keep = eager_chunk_room(config, eight_b)
    assert keep == reserve + reserve // 2
    free, set_bytes = int(7.12 * GIB), int(1.16 * GIB)
    captured = []
    for share in (112, 96, 80, 64, 48, 32):
        if not share_set_fits(free, set_bytes, keep):
            break
        free -= set_bytes
        captured.append(share)
    assert captured == [112, 96, 80] and free > 3.5 * GIB
