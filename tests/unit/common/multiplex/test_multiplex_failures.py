"""Multiplexed mode on the CPU when a launch fails: a chunk whose launch raises, a chunk or a decode step
that runs out of memory (computed again, then given up on), with the engine serving on afterwards and
every block returned."""

from __future__ import annotations

import pytest
import torch

from common.attention.context import get_forward_context
from common.core.step_records import SequencesFailed
from common.runner.memory_retry import MemoryRetries, TokenBudget
from tests.helpers.out_of_memory import forward_running_out_of_memory, parts_running_out_of_memory
from tests.unit.common.multiplex.tiny_llm import GREEDY, tiny_llm


def test_a_failed_chunk_launch_leaves_the_engine_serving(tiny_model_dirs, monkeypatch):
    mux = tiny_llm(tiny_model_dirs["qwen3"], pd_multiplex=True, async_scheduling=True)
    engine = mux.engine
    engine.add_request([5, 6, 7], GREEDY, request_id="b")
    engine.step()  # b prefilled; it decodes from the next step on
    model = engine.runner.model
    real = model.forward_in_parts

    def failing(*args):
        parts = real(*args)
        yield next(parts)  # the first of its two parts
        raise RuntimeError("device error")

    monkeypatch.setattr(model, "forward_in_parts", lambda *a: failing(*a))
    engine.add_request(list(range(1, 40)), GREEDY, request_id="a")
    with pytest.raises(RuntimeError, match="device error"):
        for _ in range(3):
            engine.step()  # a's chunk: its first part, a decode step for b, then the failing part
    assert not engine.multiplexer.chunk_in_flight
    monkeypatch.setattr(model, "forward_in_parts", real)
    assert sorted(s.request_id for s in engine.abort(["a", "b"])) == ["a", "b"]  # as a worker's fail_all
    while engine.has_unfinished:
        engine.step()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    want = tiny_llm(tiny_model_dirs["qwen3"]).generate([[9, 8, 7, 6]], GREEDY, use_tqdm=False)
    assert mux.generate([[9, 8, 7, 6]], GREEDY, use_tqdm=False)[0]["token_ids"] == want[0]["token_ids"]


@pytest.mark.parametrize("after,at_part", [(False, 1), (False, 0), (True, 0), (True, 1)])
def test_a_chunk_out_of_memory_is_computed_again_and_decoding_goes_on(
    tiny_model_dirs, monkeypatch, after, at_part
):
    """The chunk's sequences go back to the queue and are computed again; the sequence decoding beside
    it keeps decoding; every token equals the aggregated engine's and every block comes back (the
    chunk started beside its step's decode step or after it, failing in its first part or later)."""
    mux = tiny_llm(tiny_model_dirs["qwen3"], pd_multiplex=True, async_scheduling=True)
    engine = mux.engine
    engine.multiplexer.chunk_after_decode = after
    got: dict[str, list[int]] = {"a": [], "b": []}

    def step() -> None:
        for update in engine.step().updates:
            if update.new_token_id is not None:
                got[update.seq.request_id].append(update.new_token_id)

    engine.add_request([5, 6, 7], GREEDY, request_id="b")
    step()  # b prefilled: it decodes from the next step on, so a's chunk runs in parts
    raised = parts_running_out_of_memory(monkeypatch, engine.runner.model, times=1, at_part=at_part)
    engine.add_request(list(range(1, 40)), GREEDY, request_id="a")
    while engine.has_unfinished:
        step()
    assert raised[0] == 1 and engine.multiplexer.memory_retries.recomputed == 1
    plain = tiny_llm(tiny_model_dirs["qwen3"]).generate(
        [list(range(1, 40)), [5, 6, 7]], GREEDY, use_tqdm=False
    )
    assert got == {"a": plain[0]["token_ids"], "b": plain[1]["token_ids"]}
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


@pytest.mark.parametrize("after,at_part", [(False, 1), (False, 0), (True, 0), (True, 1)])
def test_a_chunk_that_keeps_running_out_of_memory_fails_its_requests_alone(
    tiny_model_dirs, monkeypatch, after, at_part
):
    """Past its retries the chunk's requests fail (`SequencesFailed`, raised once the step's decode
    work is done and carrying its result) and nothing else: once they are aborted the sequence decoding
    beside it finishes with the aggregated engine's tokens, none lost, and every block comes back."""
    mux = tiny_llm(tiny_model_dirs["qwen3"], pd_multiplex=True, async_scheduling=True)
    engine = mux.engine
    engine.multiplexer.chunk_after_decode = after
    got: list[int] = []

    def record(result) -> None:
        got.extend(u.new_token_id for u in result.updates if u.seq.request_id == "b" and u.new_token_id)

    engine.add_request([5, 6, 7], GREEDY, request_id="b")
    record(engine.step())
    retries = engine.multiplexer.memory_retries.max_retries
    raised = parts_running_out_of_memory(monkeypatch, engine.runner.model, times=retries + 1, at_part=at_part)
    engine.add_request(list(range(1, 40)), GREEDY, request_id="a")
    failure = None
    for _ in range(10 * (retries + 1)):
        try:
            record(engine.step())
        except SequencesFailed as e:
            failure = e
            break
    assert failure is not None and failure.request_ids == {"a"}
    assert isinstance(failure.cause, torch.OutOfMemoryError)
    assert raised[0] == retries + 1 and engine.multiplexer.memory_retries.recomputed == retries
    assert failure.result.updates  # the decode step beside the failed chunk still counts
    record(failure.result)
    assert [s.request_id for s in engine.abort(["a"])] == ["a"]  # as a worker's fail_request
    while engine.has_unfinished:
        record(engine.step())
    plain = tiny_llm(tiny_model_dirs["qwen3"]).generate([[5, 6, 7]], GREEDY, use_tqdm=False)
    assert got == plain[0]["token_ids"]
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_a_decode_step_out_of_memory_is_computed_again(tiny_model_dirs, monkeypatch):
    """The decode step's sequences go back to the queue (preempted by recompute) and their tokens do
    not change; every block comes back."""
    mux = tiny_llm(tiny_model_dirs["qwen3"], pd_multiplex=True, async_scheduling=True)
    engine = mux.engine
    got: dict[str, list[int]] = {"b": []}
    engine.add_request([5, 6, 7], GREEDY, request_id="b")
    for _ in range(3):  # b prefilled by a chunk, then decoding
        for update in engine.step().updates:
            if update.new_token_id is not None:
                got["b"].append(update.new_token_id)

    def in_a_decode_step() -> None:  # decode steps call forward; chunks run forward_in_parts
        assert get_forward_context().meta.is_decode

    raised = forward_running_out_of_memory(monkeypatch, engine.runner.model, times=1, check=in_a_decode_step)
    while engine.has_unfinished:
        for update in engine.step().updates:
            if update.new_token_id is not None:
                got["b"].append(update.new_token_id)
    assert raised[0] == 1 and engine.multiplexer.memory_retries.recomputed == 1
    plain = tiny_llm(tiny_model_dirs["qwen3"]).generate([[5, 6, 7]], GREEDY, use_tqdm=False)
    assert got == {"b": plain[0]["token_ids"]}
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_a_decode_step_out_of_retries_fails_its_requests_alone(tiny_model_dirs, monkeypatch):
    """A decode step whose sequences are out of retries fails their requests (`SequencesFailed`) and
    nothing else: the prompt being chunked beside it goes on to the aggregated engine's tokens, and
    every block comes back once the failed request is aborted. (A recomputed sequence is prefilled by a
    chunk, whose success resets its count, so only an inlined one can run out in decode steps:
    no retries here reach that branch at once.)"""
    mux = tiny_llm(tiny_model_dirs["qwen3"], pd_multiplex=True, async_scheduling=True)
    engine = mux.engine
    engine.multiplexer.memory_retries = MemoryRetries(max_retries=0)
    # 8-token chunks: the long prompt is still prefilling when b's decode step fails.
    engine.multiplexer.chunk_budget = TokenBudget(8, floor=8, restore_after=1000)
    engine.add_request([5, 6, 7], GREEDY, request_id="b")
    for _ in range(3):  # b prefilled by a chunk, then decoding
        engine.step()
    prompt = list(range(1, 200))
    engine.add_request(prompt, GREEDY, request_id="a")
    got = [u.new_token_id for u in engine.step().updates if u.seq.request_id == "a" and u.new_token_id]

    def in_a_decode_step() -> None:  # decode steps call forward; chunks run forward_in_parts
        assert get_forward_context().meta.is_decode

    raised = forward_running_out_of_memory(monkeypatch, engine.runner.model, times=1, check=in_a_decode_step)
    with pytest.raises(SequencesFailed) as failed:
        engine.step()
    assert failed.value.request_ids == {"b"} and isinstance(failed.value.cause, torch.OutOfMemoryError)
    assert raised[0] == 1 and failed.value.result.updates  # the step's run-ahead token of b still counts
    assert [s.request_id for s in engine.abort(["b"])] == ["b"]  # as a worker's fail_request
    while engine.has_unfinished:
        got += [u.new_token_id for u in engine.step().updates if u.seq.request_id == "a" and u.new_token_id]
    plain = tiny_llm(tiny_model_dirs["qwen3"]).generate([prompt], GREEDY, use_tqdm=False)
    assert got == plain[0]["token_ids"]
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_after_a_chunk_runs_out_of_memory_chunks_are_smaller(tiny_model_dirs, monkeypatch):
    """The chunk computed again and those after it take half the tokens (an eager chunk's activations
    scale with its tokens), and the tokens still equal the aggregated engine's."""
    mux = tiny_llm(tiny_model_dirs["qwen3"], pd_multiplex=True, async_scheduling=True)
    engine = mux.engine
    engine.multiplexer.chunk_budget = TokenBudget(32, floor=8, restore_after=100)
    budgets: list[int] = []
    real = engine.scheduler.schedule_prefill

    def recording(budget, *args):
        budgets.append(budget)
        return real(budget, *args)

    monkeypatch.setattr(engine.scheduler, "schedule_prefill", recording)
    got: list[int] = []
    engine.add_request([5, 6, 7], GREEDY, request_id="b")
    engine.step()
    raised = parts_running_out_of_memory(monkeypatch, engine.runner.model, times=1)
    engine.add_request(list(range(1, 70)), GREEDY, request_id="a")
    while engine.has_unfinished:
        got += [u.new_token_id for u in engine.step().updates if u.seq.request_id == "a" and u.new_token_id]
    assert raised[0] == 1 and budgets[:2] == [32, 32] and set(budgets[2:]) == {16}
    plain = tiny_llm(tiny_model_dirs["qwen3"]).generate([list(range(1, 70))], GREEDY, use_tqdm=False)
    assert got == plain[0]["token_ids"]
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
