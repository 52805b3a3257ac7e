"""The load-following split: rungs move with the decode gaps measured beside prefill chunks."""

from __future__ import annotations

import pytest

from common.multiplex.controller import SOLO_WINDOW, ControllerConfig, ShareController
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


def test_the_lowest_rung_is_a_floor_and_a_start_above_the_middle():
    c = ShareController(ControllerConfig(TARGET, num_lanes=7, lowest_rung=4))
    assert _chunk(c, [0.02] * 10) == 4  # starts on the floor, not the middle rung (3)
    assert _chunk(c, [0.02] * 10) == 4  # over the target, but no rung below the floor
    assert _chunk(c, [0.001] * 10) == 4
    assert c.next_lane(True) == 5  # grows as before, never to the whole device
    assert _chunk(ShareController(ControllerConfig(TARGET, num_lanes=7, lowest_rung=1)), []) == 3


def test_knee_does_not_measure_below_the_floor():
    c = ShareController(ControllerConfig(TARGET, num_lanes=7, knee=True, lowest_rung=3))
    _chunk(c, [0.008] * 10)  # between grow_below x target and target, the rung below unknown
    assert c.next_lane(True) == 3  # a knee rule would step down to measure rung 2: the floor holds


def test_one_lane_is_the_whole_device_for_every_chunk():
    c = _controller(lanes=1)
    assert _chunk(c, [0.001] * 5) == 0
    assert c.next_lane(True) == 0


# The decode gap beside a chunk per share (32..112 of 132 SMs) measured on an H100, 8B shape, 64 decode
# rows (docs/benchmarks.md): flat to 64 SMs, rising beyond. The knee is rung 2.
H100_8B_CURVE = [0.0102, 0.0103, 0.0103, 0.0122, 0.0144, 0.0181]


def _settle(c: ShareController, curve: list[float], chunks: int, behind: bool = False) -> list[int]:
    """The lanes of `chunks` chunks, each measuring its rung's gap on `curve`."""
    lanes = []
    for _ in range(chunks):
        lane = c.next_lane(True, behind)
        lanes.append(lane)
        for _ in range(10):
            c.observe_decode(curve[lane])
    return lanes


def test_knee_finds_the_largest_share_decode_does_not_feel():
    target = ShareController(ControllerConfig(0.030, num_lanes=7))
    assert _settle(target, H100_8B_CURVE, 8)[-3:] == [5, 5, 5]  # grows while gaps stay under 18 ms
    knee = ShareController(ControllerConfig(0.030, num_lanes=7, knee=True))
    lanes = _settle(knee, H100_8B_CURVE, 12)
    assert lanes[:6] == [3, 4, 3, 2, 1, 2]  # up, back, then down to measure the flat part, back up
    assert lanes[6:] == [2] * 6
    assert knee.rung_gap(3) == 0.0122 and knee.rung_gap(1) == 0.0103


def test_knee_measures_again_what_went_stale_and_returns():
    knee = ShareController(ControllerConfig(0.030, num_lanes=7, knee=True))
    lanes = _settle(knee, H100_8B_CURVE, 60)
    assert lanes[-40:].count(2) >= 32  # the knee, with a probe of each neighbour every ~18 chunks
    assert set(lanes[-40:]) <= {1, 2, 3}
    shifted = H100_8B_CURVE[:1] + [0.0104, 0.0104, 0.0105, 0.0106, 0.0190]  # smaller batch: flat to 96 SMs
    assert _settle(knee, shifted, 40)[-5:] == [4] * 5


def test_knee_gives_way_to_the_target_rule_while_prefill_is_behind():
    knee = ShareController(ControllerConfig(0.030, num_lanes=7, knee=True))
    _settle(knee, H100_8B_CURVE, 12)
    assert _settle(knee, H100_8B_CURVE, 6, behind=True)[-2:] == [5, 5]  # gaps under 18 ms: prefill grows
    assert _settle(knee, H100_8B_CURVE, 8) == [4, 3, 2, 2, 1, 2, 2, 2]  # kept up again: back to the knee


def test_without_knee_no_rung_gap_is_kept():
    plain = _controller()
    _chunk(plain, [0.004] * 10)
    assert plain.next_lane(True) == 3 and plain.rung_gap(2) is None


def test_solo_ratio_holds_a_multiple_of_the_solo_gap_capped_by_the_target():
    c = ShareController(ControllerConfig(0.030, num_lanes=5, solo_ratio=2.0))
    assert c.target == 0.030  # no solo gap seen yet: the configured target
    for gap in [0.006] * 40 + [0.5]:  # one slow step does not move the median
        c.observe_solo(gap)
    assert c.target == pytest.approx(0.012)
    # Beside a chunk decode takes 16 ms: under the 30-ms target, over 2x the 6-ms solo gap: down a rung.
    assert _chunk(c, [0.016] * 10) == 2
    assert c.next_lane(True) == 1
    for _ in range(SOLO_WINDOW):  # a larger batch: the solo gap doubles, and the cap holds
        c.observe_solo(0.020)
    assert c.target == 0.030


@pytest.mark.parametrize("drain,after", [(False, 1), (True, 3)])
def test_drain_holds_the_cap_while_prefill_is_behind(drain, after):
    """Solo gaps of 6 ms make the ratio's target 12 ms; beside a chunk decode takes 16 ms. While prefill
    is behind, `drain` judges that against the 30-ms cap (under 0.6 x 30: up a rung), the plain rule
    against 12 ms (over: down a rung); once prefill keeps up, both judge against 12 ms."""
    c = ShareController(ControllerConfig(0.030, num_lanes=5, solo_ratio=2.0, drain=drain))
    for gap in [0.006] * 10:
        c.observe_solo(gap)
    assert _chunk(c, [0.016] * 10, behind=True) == 2
    assert _chunk(c, [0.016] * 10, behind=True) == after
    assert c.next_lane(True, behind=False) == after - 1
    assert c.held_target(True) == pytest.approx(0.030 if drain else 0.012)  # what the stats line shows
    assert c.held_target(False) == pytest.approx(0.012)


def test_decode_outputs_make_gaps_beside_a_chunk_or_solo_and_a_pause_starts_none():
    c = ShareController(ControllerConfig(0.030, num_lanes=5, solo_ratio=2.0))
    c.next_lane(True)  # a chunk beside decode: its gaps count
    assert c.decode_output(1.000, beside_chunk=True) is False  # the first output starts no gap
    assert c.decode_output(1.016, beside_chunk=True) is True
    assert c.decode_output(1.022, beside_chunk=False) is False  # solo: 6 ms
    c.decode_paused()
    assert c.decode_output(5.0, beside_chunk=False) is False  # after a pause: no 4-s gap
    assert c.target == pytest.approx(0.012)
    assert c.next_lane(True) == 1  # the 16-ms gap beside the chunk is over 2 x 6 ms: down a rung


def test_without_solo_ratio_solo_gaps_are_not_kept():
    c = _controller()
    c.observe_solo(0.001)
    assert c.target == TARGET
    _chunk(c, [0.008] * 10)  # between 0.6 x target and target: stays
    assert c.next_lane(True) == 2


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        (dict(itl_target_s=1, num_lanes=2, solo_ratio=1.0), "solo_ratio"),
        (dict(itl_target_s=1, num_lanes=2, solo_ratio=-2), "solo_ratio"),
        (dict(itl_target_s=1, num_lanes=2, solo_ratio=True), "solo_ratio"),
        (dict(itl_target_s=0, num_lanes=2), "itl_target_s"),
        (dict(itl_target_s=1, num_lanes=0), "num_lanes"),
        (dict(itl_target_s=1, num_lanes=2, grow_below=1), "grow_below"),
        (dict(itl_target_s=1, num_lanes=2, knee="yes"), "knee"),
        (dict(itl_target_s=1, num_lanes=2, drain=1), "drain"),
        (dict(itl_target_s=1, num_lanes=2, knee=True, drain=True), "knee and drain"),
        (dict(itl_target_s=1, num_lanes=2, drain=True), "drain needs solo_ratio"),  # would change nothing
        (dict(itl_target_s=1, num_lanes=3, lowest_rung=2), "lowest_rung"),  # the whole device: no floor
        (dict(itl_target_s=1, num_lanes=3, lowest_rung=-1), "lowest_rung"),
        (dict(itl_target_s=1, num_lanes=3, lowest_rung=True), "lowest_rung"),
    ],
)
def test_config_is_validated(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ControllerConfig(**kwargs)


def test_share_sizes_follow_the_granularity():
    assert share_sizes(132) == [32, 48, 64, 80, 96, 112]  # H100/H200
    assert share_sizes(16) == [8]
    assert all(s % 8 == 0 for s in share_sizes(108))
    with pytest.raises(ValueError):
        share_sizes(0)
