"""The chunk's slow-launch log: which launches it names, and whether it calls them first uses."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from common.multiplex.chunk import SLOW_LAUNCH_S, SlowLaunches
from tests.unit.common.multiplex.tiny_llm import GREEDY, tiny_llm


def _chunk(bucket: int | None, tokens: int = 512) -> SimpleNamespace:
    return SimpleNamespace(launch=SimpleNamespace(bucket=bucket), tokens=tokens)


def test_slow_launches_are_logged_with_their_share_bucket_and_first_use(caplog):
    slow = SlowLaunches()
    caplog.set_level(logging.WARNING, logger="common.multiplex.chunk")
    assert not slow.record(64, _chunk(2048), SLOW_LAUNCH_S / 2)  # fast: quiet, but now seen
    assert slow.record(64, _chunk(2048), SLOW_LAUNCH_S * 5)
    assert slow.record(56, _chunk(None, 700), SLOW_LAUNCH_S * 2)
    assert slow.record(None, _chunk(4096), SLOW_LAUNCH_S * 3)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert "on 64 SMs, graph bucket 2048, 512 tokens, share and bucket used before" in lines[0]
    assert "on 56 SMs, eager, 700 tokens, first use of that share and bucket" in lines[1]
    assert "on all SMs, graph bucket 4096" in lines[2] and "first use" in lines[2]


def test_the_stepper_times_every_chunk_part(tiny_model_dirs, monkeypatch):
    """Each launched part reaches the log with its share and its host time (eager on the CPU)."""
    mux = tiny_llm(tiny_model_dirs["qwen3"], pd_multiplex=True)
    seen: list[tuple[int | None, int | None, float]] = []
    monkeypatch.setattr(
        mux.engine.multiplexer.slow_launches,
        "record",
        lambda sms, chunk, seconds: seen.append((sms, chunk.launch.bucket, seconds)) or False,
    )
    mux.generate([[5, 6, 7], list(range(1, 40))], GREEDY, use_tqdm=False)
    assert seen and all(bucket is None and seconds > 0 for _, bucket, seconds in seen)
    assert len(seen) == mux.engine.multiplexer.stats.chunk_parts
