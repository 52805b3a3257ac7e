"""An aggregated engine step that runs out of device memory is computed again, the steps after it
smaller, and past its retries its requests alone fail (common/runner/memory_retry.py,
common/runner/aggregated_steps.py).

On the CPU the allocator's error is raised from the model's forward; the multiplexed chunks' side of the
same rule is tested in tests/unit/common/multiplex/test_multiplex_engine.py."""

from __future__ import annotations

import pytest
import torch

from common import LLM, SamplingParams
from common.core.step_records import SequencesFailed, StepTimings
from common.runner.aggregated_steps import AggregatedSteps
from common.runner.memory_retry import MAX_RETRIES, TokenBudget
from tests.helpers.out_of_memory import forward_running_out_of_memory

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
PROMPTS = {"a": list(range(1, 40)), "b": [5, 6, 7]}


def _llm(model_dir: str, **kw) -> LLM:
    return LLM(model_dir, num_kvcache_blocks=96, kvcache_block_size=16, max_num_batched_tokens=32, **kw)


def _collect(engine, got: dict[str, list[int]]) -> None:
    for update in engine.step().updates:
        if update.new_token_id is not None:
            got[update.seq.request_id].append(update.new_token_id)


@pytest.mark.parametrize("ahead", [False, True])
def test_a_step_out_of_memory_is_computed_again(tiny_model_dirs, monkeypatch, ahead):
    """The failed step's sequences (one decoding, one arriving) are computed again from their tokens:
    every token equals an undisturbed run's and every block comes back."""
    engine = _llm(tiny_model_dirs["qwen3"], async_scheduling=ahead).engine
    got: dict[str, list[int]] = {"a": [], "b": []}
    engine.add_request(PROMPTS["b"], GREEDY, request_id="b")
    for _ in range(3):
        _collect(engine, got)  # b prefilled and decoding
    raised = forward_running_out_of_memory(monkeypatch, engine.runner.model, times=1)
    engine.add_request(PROMPTS["a"], GREEDY, request_id="a")
    while engine.has_unfinished:
        _collect(engine, got)
    assert raised[0] == 1 and engine.aggregated.memory_retries.recomputed == 1
    plain = _llm(tiny_model_dirs["qwen3"]).generate([PROMPTS["a"], PROMPTS["b"]], GREEDY, use_tqdm=False)
    assert got == {"a": plain[0]["token_ids"], "b": plain[1]["token_ids"]}
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_a_step_that_keeps_running_out_of_memory_fails_its_requests_alone(tiny_model_dirs, monkeypatch):
    """After `max_retries` recomputations the step's requests fail (`SequencesFailed`, carrying the
    allocator's error); the engine goes on: aborting them gives every block back, and a request that
    arrives later gets the tokens of an undisturbed run."""
    engine = _llm(tiny_model_dirs["qwen3"]).engine
    retries = engine.aggregated.memory_retries.max_retries
    raised = forward_running_out_of_memory(monkeypatch, engine.runner.model, times=retries + 1)
    engine.add_request(PROMPTS["a"], GREEDY, request_id="a")
    with pytest.raises(SequencesFailed) as failed:
        for _ in range(10 * (retries + 1)):
            engine.step()
    assert failed.value.request_ids == {"a"} and isinstance(failed.value.cause, torch.OutOfMemoryError)
    assert raised[0] == retries + 1 and engine.aggregated.memory_retries.recomputed == retries
    assert [s.request_id for s in engine.abort(["a"])] == ["a"]
    got: dict[str, list[int]] = {"b": []}
    engine.add_request(PROMPTS["b"], GREEDY, request_id="b")
    while engine.has_unfinished:
        _collect(engine, got)
    plain = _llm(tiny_model_dirs["qwen3"]).generate([PROMPTS["b"]], GREEDY, use_tqdm=False)
    assert got["b"] == plain[0]["token_ids"]
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_after_a_step_runs_out_of_memory_steps_are_smaller(tiny_model_dirs, monkeypatch):
    """The step computed again and those after it take half the tokens, and the tokens still equal an
    undisturbed run's."""
    engine = _llm(tiny_model_dirs["qwen3"]).engine
    engine.aggregated.step_budget = TokenBudget(32, floor=8, restore_after=100)
    budgets: list[int | None] = []
    real = engine.scheduler.schedule

    def recording(token_budget=None):
        budgets.append(token_budget)
        return real(token_budget)

    monkeypatch.setattr(engine.scheduler, "schedule", recording)
    raised = forward_running_out_of_memory(monkeypatch, engine.runner.model, times=1)
    got: dict[str, list[int]] = {"a": []}
    engine.add_request(PROMPTS["a"], GREEDY, request_id="a")
    while engine.has_unfinished:
        _collect(engine, got)
    assert raised[0] == 1 and budgets[0] is None and set(budgets[1:]) == {16}
    plain = _llm(tiny_model_dirs["qwen3"]).generate([PROMPTS["a"]], GREEDY, use_tqdm=False)
    assert got["a"] == plain[0]["token_ids"]


def test_any_other_error_in_a_launch_is_raised_at_once(tiny_model_dirs, monkeypatch):
    engine = _llm(tiny_model_dirs["qwen3"]).engine

    def broken(*args, **kwargs):
        raise RuntimeError("an illegal memory access was encountered")

    monkeypatch.setattr(engine.runner.model, "forward", broken)
    engine.add_request(PROMPTS["b"], GREEDY, request_id="b")
    with pytest.raises(RuntimeError, match="illegal memory access"):
        engine.step()
    assert engine.aggregated.memory_retries.recomputed == 0


def test_tensor_parallel_engines_do_not_retry(tiny_model_dirs):
    """The other ranks may wait inside the failed launch's collectives: the error stands at once."""
    runner = _llm(tiny_model_dirs["qwen3"]).engine.runner
    assert AggregatedSteps(runner, StepTimings(), False, 32).memory_retries.max_retries == MAX_RETRIES
    runner.tp = object()  # what a rank-0 runner of a tensor-parallel group holds
    try:
        assert AggregatedSteps(runner, StepTimings(), False, 32).memory_retries.max_retries == 0
    finally:
        runner.tp = None  # the engine's close stops its ranks through it


def test_the_token_budget_halves_to_its_floor_and_grows_back():
    budget = TokenBudget(8192, floor=512, restore_after=2)
    for want in (4096, 2048, 1024, 512, 512):
        budget.ran_out()
        assert budget.tokens == want
    budget.resolved()
    assert budget.tokens == 512  # one launch resolved: not yet
    budget.resolved()
    assert budget.tokens == 1024
    budget.ran_out()  # an error resets the run
    budget.resolved()
    assert budget.tokens == 512
    assert TokenBudget(256, floor=512).tokens == 256  # a floor above the full budget: the full one
    with pytest.raises(ValueError, match="floor"):
        TokenBudget(8192, floor=0)
