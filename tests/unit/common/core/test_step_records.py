"""StepTimings: benchmarks reset the engine's counters in place, so a holder of the object (the
multiplexed stepper) keeps counting into what they read."""

from __future__ import annotations

from common.core.step_records import StepTimings


def test_reset_zeroes_the_counters_in_place():
    timings = StepTimings(decode_steps=3, device_wait=1.5, shared_chunks=2, drains={"speculate": 1})
    holder = timings
    timings.reset()
    assert holder is timings and holder == StepTimings()
    holder.decode_steps += 1
    assert timings.decode_steps == 1
