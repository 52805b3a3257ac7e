"""The worker's periodic stats line: rates and step counts over the interval, nothing when idle."""

from __future__ import annotations

import gc
import logging
import re
import time

from common.core.step_records import EngineLoad, StepTimings
from common.net.gc_heap import GcPauseMeter
from common.worker.stats_log import StatsLog

LOAD = EngineLoad(
    num_free_blocks=10,
    num_total_blocks=20,
    num_waiting=3,
    num_running=7,
    num_transferring=0,
    queued_prefill_tokens=0,
)


def test_the_line_counts_the_interval_only(caplog):
    timings = StepTimings(decode_steps=100, decode_forward=1.0)  # before the interval: not counted
    stats = StatsLog(0.01)
    stats.record(timings, prompt_tokens=0, generated_tokens=0, step_s=0.0)  # the interval starts here
    timings.decode_steps += 4
    timings.decode_forward += 0.008
    timings.prefill_steps += 1
    timings.prefill_forward += 0.010
    timings.device_wait += 0.004
    stats.record(timings, prompt_tokens=512, generated_tokens=7, step_s=0.02)
    stats.record_loop(commands_s=0.001, role_s=0.002, handoff_s=0.0005)
    stats.record_loop(commands_s=0.0, role_s=0.0005, handoff_s=0.0)
    time.sleep(0.02)
    with caplog.at_level(logging.INFO, logger="common.worker.stats_log"):
        stats.maybe_log(lambda: LOAD)
    (line,) = [r.getMessage() for r in caplog.records]
    assert "steps: 4 decode (2.00 ms), 1 with prompt tokens (10.00 ms)" in line
    assert "engine host 2.80 ms" in line  # (8 + 10 - 4) ms over 5 steps
    assert "(commands 0.20, role 0.50, hand-off 0.10)" in line  # per step, over the 5 steps
    assert line.endswith("running 7, waiting 3")  # no multiplexed part: no chunk beside decode
    caplog.clear()
    time.sleep(0.02)
    with caplog.at_level(logging.INFO, logger="common.worker.stats_log"):
        stats.maybe_log(lambda: LOAD)  # an idle interval: nothing
    assert caplog.records == []


def test_zero_interval_logs_nothing(caplog):
    stats = StatsLog(0)
    stats.record(StepTimings(), 1, 1, 0.001)
    for _ in range(1000):
        stats.record(StepTimings(), 1, 1, 0.001, "decode")
    with caplog.at_level(logging.INFO, logger="common.worker.stats_log"):
        stats.maybe_log(lambda: LOAD)
    assert caplog.records == []
    assert "step ms by class" not in stats.line(1.0, LOAD)  # nothing kept that no line would clear


def test_multiplexed_chunks_and_inline_prompts_end_the_line(caplog):
    timings = StepTimings(shared_chunks=5, shared_chunk_sms=400)  # before the interval: not counted
    stats = StatsLog(0.01)
    stats.record(timings, prompt_tokens=0, generated_tokens=0, step_s=0.0)
    timings.decode_steps += 10
    timings.shared_chunks += 2
    timings.shared_chunk_sms += 48 + 112
    timings.shared_chunk_target_ms += 12.0 + 13.0
    timings.inline_prompts += 3
    stats.record(timings, prompt_tokens=900, generated_tokens=10, step_s=0.01)
    time.sleep(0.02)
    with caplog.at_level(logging.INFO, logger="common.worker.stats_log"):
        stats.maybe_log(lambda: LOAD)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.endswith("chunks beside decode 2 (mean share 80 SMs, target 12.5 ms), inline prompts 3")


def test_the_interval_garbage_collections_end_the_line(caplog):
    meter = GcPauseMeter()
    stats = StatsLog(0.01)
    stats.gc_meter = meter
    stats.record(StepTimings(), prompt_tokens=0, generated_tokens=0, step_s=0.0)
    stats.record(StepTimings(decode_steps=1), prompt_tokens=0, generated_tokens=3, step_s=0.001)
    meter.install()
    try:
        gc.collect(0)
        gc.collect(2)
    finally:
        meter.uninstall()
    time.sleep(0.02)
    with caplog.at_level(logging.INFO, logger="common.worker.stats_log"):
        stats.maybe_log(lambda: LOAD)
    (line,) = [r.getMessage() for r in caplog.records]
    assert re.search(r"gc 2 collections \(1 full\), [0-9.]+ ms, longest [0-9.]+ ms$", line), line
    assert meter.take().collections == 0  # the line took the interval's figures


def test_steps_recorded_with_a_class_split_the_wall_time_by_class(caplog):
    stats = StatsLog(0.01)
    stats.record(StepTimings(), prompt_tokens=0, generated_tokens=0, step_s=0.0)
    for ms in range(1, 101):  # 100 beside steps of 1..100 ms; 2 launches
        stats.record(StepTimings(decode_steps=ms), 0, 64, ms / 1e3, "beside")
    stats.record(StepTimings(decode_steps=101), 0, 64, 0.012, "launch")
    stats.record(StepTimings(decode_steps=102), 0, 64, 0.014, "launch")
    time.sleep(0.02)
    with caplog.at_level(logging.INFO, logger="common.worker.stats_log"):
        stats.maybe_log(lambda: LOAD)
    (line,) = [r.getMessage() for r in caplog.records]
    # numpy's percentiles of 1..100: p50 50.5, p99 99.01; the most frequent class first
    assert "step ms by class, p50 / p99 / max: beside 100 (50.50 / 99.01 / 100.00); launch 2 (13.00" in line
    assert line.endswith("14.00)")  # nothing multiplexed in the counters, no collections
