"""Admission delay (vLLM's scheduler delay factor): new prompts wait while a batch decodes, within bounds."""

from __future__ import annotations

import time

import pytest

from common.config import EngineConfig
from common.core.batch import SchedulerConfig
from common.core.block_manager import BlockManager
from common.core.scheduler import Scheduler
from common.core.sequence import Sequence
from common.runner.output import RunnerOutput
from common.wire.sampling_params import SamplingParams

BS = 4
PROMPT_STEP_S = 0.05  # how long the test's prompt-carrying step "runs" (a sleep between schedules)


def _sched(factor: float, role: str = "mixed", budget: int = 64) -> Scheduler:
    cfg = SchedulerConfig(8, budget, 256, role, frozenset(), delay_factor=factor)
    return Scheduler(cfg, BlockManager(128, BS))


def _seq(n: int = 8) -> Sequence:
    return Sequence(list(range(10, 10 + n)), SamplingParams(max_tokens=50, ignore_eos=True), BS)


def _run(s: Scheduler, pause: float = 0.0) -> list[Sequence]:
    """One step: schedule, 'compute' for `pause` seconds, sample token 7 for every finished prompt."""
    batch = s.schedule()
    time.sleep(pause)
    sampled = [[7] if q.num_cached_tokens + q.num_scheduled_tokens == len(q) else [] for q in batch.seqs]
    s.update_from_output(batch.seqs, RunnerOutput(sampled, [None] * len(sampled)))
    return batch.seqs


def _decoding(s: Scheduler) -> Sequence:
    """A scheduler with one decoding sequence whose prompt step took PROMPT_STEP_S."""
    first = _seq()
    s.add(first)
    assert _run(s, pause=PROMPT_STEP_S) == [first]  # the prompt step
    return first


def test_a_new_prompt_waits_while_a_batch_decodes_then_joins():
    s = _sched(factor=1.0)
    first = _decoding(s)
    new = _seq()
    s.add(new)
    assert _run(s) == [first]  # held: it has waited less than one prompt step
    assert s.admission_delay.last_prompt_step_s >= PROMPT_STEP_S
    time.sleep(PROMPT_STEP_S * 1.5)
    assert _run(s) == [first, new]  # waited past factor x the last prompt step: admitted


def test_factor_zero_admits_at_once():
    s = _sched(factor=0.0)
    first = _decoding(s)
    new = _seq()
    s.add(new)
    assert _run(s) == [first, new]


def test_nothing_running_admits_at_once():
    s = _sched(factor=100.0)
    s.add(_seq())
    s.add(_seq())
    assert len(_run(s, pause=PROMPT_STEP_S)) == 2


def test_waiting_prompts_that_fill_the_budget_are_admitted_at_once():
    s = _sched(factor=100.0, budget=16)
    first = _decoding(s)
    a, b = _seq(), _seq()  # 8 + 8 prompt tokens: with the decode row more than the budget of 16
    s.add(a)
    assert _run(s) == [first]
    s.add(b)
    assert _run(s) == [first, a, b]  # a whole chunk, b's first 7 tokens


def test_the_prefill_role_never_holds():
    s = _sched(factor=100.0, role="prefill")
    s.add(_seq())
    _run(s, pause=PROMPT_STEP_S)  # handed off: nothing runs afterwards, so use a long prompt instead
    long = Sequence(list(range(10, 10 + 100)), SamplingParams(max_tokens=1), BS)
    s.add(long)
    _run(s, pause=PROMPT_STEP_S)  # chunk 1 of `long` (budget 64): it keeps running
    new = _seq()
    s.add(new)
    assert new in _run(s)


@pytest.mark.parametrize("bad", [-0.5, "1", True, 101.0])
def test_the_engine_config_rejects_a_bad_factor(bad):
    with pytest.raises(ValueError, match="scheduler_delay_factor"):
        EngineConfig(model="m", scheduler_delay_factor=bad)
