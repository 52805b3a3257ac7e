"""The load-following split: rungs move with the decode gaps measured beside prefill chunks."""

from __future__ import annotations

import pytest

from common.multiplex.controller import ControllerConfig, ShareController
from common.multiplex.green_contexts import share_sizes

TARGET = 0.010


def _controller(lanes: int = 5, knee: bool = False) -> ShareController:
    return ShareController(ControllerConfig(TARGET, num_lanes=lanes, knee=knee))


def _chunk(c: ShareController, gaps: list[float], decoding: bool = True, behind: bool = False) -> int:
    lane = c.next_lane(decoding, behind)
    for gap in gaps:
        c.observe_decode(gap)
    return lane


def test_no_decode_gets_the_whole_device_and_keeps_the_rung():
    c = _controller()
    assert _chunk(c, [], decoding=False) == 4
    assert _chunk(c, [0.5], decoding=False) == 4  # gaps beside a whole-device chunk say nothing
    assert c.next_lane(True) == 2


def test_shrinks_when_over_target_grows_when_well_under():
    c = _controller()
    assert _chunk(c, [0.02] * 10) == 2
    assert _chunk(c, [0.02] * 10) == 1
    assert _chunk(c, [0.02] * 10) == 0
    assert _chunk(c, [0.008] * 10) == 0  # the bottom rung: stays
    assert c.next_lane(True) == 0  # between grow_below x target and target: stays
    _chunk(c, [0.001] * 10)
    assert c.next_lane(True) == 1


def test_grows_up_to_the_largest_share_short_of_the_whole_device_and_ignores_one_outlier():
    c = _controller(lanes=4)
    _chunk(c, [0.001] * 20 + [1.0])
    assert _chunk(c, [0.001] * 5) == 2  # the largest share: the whole device (3) is kept for no decode
    assert c.next_lane(True) == 2
    assert c.next_lane(False) == 3


def test_one_lane_is_the_whole_device_for_every_chunk():
    c = _controller(lanes=1)
    assert _chunk(c, [0.001] * 5) == 0
    assert c.next_lane(True) == 0


def test_knee_holds_decode_near_its_solo_gap_while_prefill_keeps_up():
    c = _controller(knee=True)
    for _ in range(8):
        c.observe_solo(0.002)
    assert c.solo_seconds == 0.002
    assert _chunk(c, [0.0028] * 10) == 2  # 1.4x solo: the target rule would grow (under 0.6 x 10 ms)
    assert _chunk(c, [0.0024] * 10) == 1  # shrunk; 1.2x solo: between FLAT and KNEE, stays
    assert _chunk(c, [0.0021] * 10) == 1  # under FLAT x solo: decode does not feel it, grows
    assert c.next_lane(True) == 2


def test_knee_lets_prefill_grow_up_to_the_target_when_prompts_are_left_waiting():
    c = _controller(knee=True)
    for _ in range(8):
        c.observe_solo(0.002)
    _chunk(c, [0.004] * 10, behind=True)  # 2x solo, but behind: read against the target only
    assert c.next_lane(True, behind=True) == 3
    _chunk(c, [0.004] * 10)  # kept up again: 2x solo is past the knee
    assert c.next_lane(True) == 2


def test_without_knee_or_solo_gaps_the_target_rule_decides():
    plain = _controller()
    plain.observe_solo(0.002)  # not read without knee
    assert plain.solo_seconds is None
    _chunk(plain, [0.004] * 10)
    assert plain.next_lane(True) == 3
    knee = _controller(knee=True)  # no solo gap seen yet
    _chunk(knee, [0.004] * 10)
    assert knee.next_lane(True) == 3


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(itl_target_s=0, num_lanes=2),
        dict(itl_target_s=1, num_lanes=0),
        dict(itl_target_s=1, num_lanes=2, grow_below=1),
        dict(itl_target_s=1, num_lanes=2, knee="yes"),
    ],
)
def test_config_is_validated(kwargs):
    with pytest.raises(ValueError):
        ControllerConfig(**kwargs)


def test_share_sizes_follow_the_granularity():
    assert share_sizes(132) == [32, 48, 64, 80, 96, 112]  # H100/H200
    assert share_sizes(16) == [8]
    assert all(s % 8 == 0 for s in share_sizes(108))
    with pytest.raises(ValueError):
        share_sizes(0)
