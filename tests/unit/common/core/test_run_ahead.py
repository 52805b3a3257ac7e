"""Run-ahead (async) decode steps give exactly the results of the synchronous loop.

Forced on here on the CPU, where every operation completes at once: this checks the bookkeeping
(placeholders, stop detection one step late, deferred frees, aborts, preemption), not the overlap.
"""

from __future__ import annotations

import itertools
import random

import pytest

from common import LLM, SamplingParams
from tests.helpers.counted_run import generate_counted


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(512) for _ in range(rng.randint(3, 60))] for _ in range(n)]


def _params(n: int, seed: int) -> list[SamplingParams]:
    rng = random.Random(seed)
    return [
        SamplingParams(
            temperature=rng.choice([0.0, 0.8]), seed=i, max_tokens=rng.randint(1, 30), min_tokens=0
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("kv_blocks", [256, 12])  # 12 blocks of 16 forces preemption
def test_run_ahead_matches_sync(tiny_model_dirs, kv_blocks):
    prompts, params = _prompts(10, 1), _params(10, 2)
    runs, preempted = [], 0
    for async_on in (False, True):
        llm = LLM(tiny_model_dirs["llama"], num_kvcache_blocks=kv_blocks, async_scheduling=async_on)
        run, count = generate_counted(llm, prompts, params)  # every block came back
        runs.append(run)
        preempted += count
    assert runs[0] == runs[1]
    assert "stop" in {reason for _, reason in runs[0]}  # EOS (id 2 here) ends one sequence early
    assert (preempted > 0) == (kv_blocks == 12)


def test_run_ahead_runs_ahead_and_handles_eos(tiny_model_dirs):
    llm = LLM(tiny_model_dirs["qwen2"], num_kvcache_blocks=256, async_scheduling=True)
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    seqs = [engine.add_request(p, params) for p in _prompts(4, 3)]
    in_flight_steps = 0
    while engine.has_unfinished:
        engine.step()
        in_flight_steps += engine.aggregated.in_flight is not None
    assert in_flight_steps >= 8  # steady-state decode really ran ahead
    sync = LLM(tiny_model_dirs["qwen2"], num_kvcache_blocks=256, async_scheduling=False)
    expected = sync.generate([s.prompt_token_ids for s in seqs], params, use_tqdm=False)
    assert [s.completion_token_ids for s in seqs] == [o["token_ids"] for o in expected]
    assert all(-1 not in s.token_ids for s in seqs)


def test_abort_while_in_flight(tiny_model_dirs):
    llm = LLM(tiny_model_dirs["llama"], num_kvcache_blocks=64, async_scheduling=True)
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    a = engine.add_request([1, 2, 3, 4], params, request_id="a")
    b = engine.add_request([5, 6, 7], params, request_id="b")
    for _ in range(5):
        engine.step()
    assert engine.aggregated.in_flight is not None
    engine.abort(["a"])
    while engine.has_unfinished:
        engine.step()
    assert a.finish_reason.value == "abort" and -1 not in a.token_ids
    assert len(b.completion_token_ids) == 40
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_length_finish_keeps_the_pipeline_full(tiny_model_dirs):
    """Sequences that end by max_tokens or by the model's context at their in-flight token leave the
    next run-ahead step instead of draining it: after admission no step resolves before the next
    launch, and every output and block count equals the synchronous loop's."""
    prompts = _prompts(6, 4)
    prompts[5] = list(range(3, 3 + 120))  # ends by the context (max_model_len 128), not max_tokens
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (5, 9, 9, 14, 20, 40)]
    runs, computed = [], []
    for async_on in (False, True):
        llm = LLM(
            tiny_model_dirs["llama"], num_kvcache_blocks=128, max_model_len=128, async_scheduling=async_on
        )
        step, tokens = llm.engine.step, [0]

        def counting_step(step=step, tokens=tokens):
            result = step()
            tokens[0] += result.num_decode_tokens + result.num_prefill_tokens
            return result

        llm.engine.step = counting_step
        outs = llm.generate(prompts, params, use_tqdm=False)
        runs.append([(o["token_ids"], o["finish_reason"]) for o in outs])
        computed.append(tokens[0])
        bm = llm.engine.block_manager
        assert bm.num_free_blocks == bm.num_blocks
        drains = llm.engine.timings.drains
        if async_on:
            assert drains == {}, drains
    assert runs[0] == runs[1]
    assert computed[0] == computed[1]  # no row computed a token past a sequence's end
    assert [len(t) for t, _ in runs[0]] == [5, 9, 9, 14, 20, 8]
    assert {r for _, r in runs[0]} == {"length"}


def test_transferred_requests_join_a_run_ahead_step(tiny_model_dirs):
    """A decode worker's requests whose KV arrives while a step is in flight join the next step as plain
    decode rows (input token from the host) instead of draining the pipeline, and every answer is the
    offline engine's."""
    from common.config import EngineConfig
    from common.llm_engine import LLMEngine

    model = tiny_model_dirs["llama"]
    prompts = _prompts(4, 5)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (12, 7, 15, 9)]
    reference = LLM(model, num_kvcache_blocks=128).generate(prompts, params, use_tqdm=False)
    pre = LLMEngine.from_config(EngineConfig(model, role="prefill", num_kvcache_blocks=128))
    dec = LLMEngine.from_config(
        EngineConfig(model, role="decode", num_kvcache_blocks=128, async_scheduling=True)
    )
    joined, in_flight_at_join = [], []
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        src = pre.add_request(prompt, p, f"r{i}")
        (update,) = pre.step().updates
        seq = dec.make_sequence([*prompt, update.new_token_id], p, f"r{i}", num_prompt_tokens=len(prompt))
        assert dec.reserve_transfer(seq)
        dec.kv_cache[:, :, dec.prompt_block_ids(seq)] = pre.kv_cache[:, :, pre.prompt_block_ids(src)]
        dec.complete_transfer(seq)
        pre.release_handoff(src)
        in_flight_at_join.append(dec.aggregated.in_flight is not None)
        joined.append(seq)
        for _ in range(3):
            dec.step()
    while dec.has_unfinished:
        dec.step()
    assert [s.completion_token_ids for s in joined] == [o["token_ids"] for o in reference]
    assert in_flight_at_join[1:] == [True, True, True]  # they really arrived behind a step in flight
    assert not dec.timings.drains, dec.timings.drains  # nothing resolved a step before its time
    assert dec.block_manager.num_free_blocks == dec.block_manager.num_blocks


@pytest.mark.parametrize("kv_blocks", [256, 14])  # 14 blocks of 16: admissions and preemptions in flight
def test_admissions_launch_behind_a_run_ahead_step(tiny_model_dirs, kv_blocks):
    """Requests arriving while a step is in flight are prefilled in a step launched behind it (no drain):
    the placeholder rows of that mixed step read the device tokens, and every answer, block count and
    finish reason equals the synchronous loop's."""
    prompts, params = _prompts(8, 6), _params(8, 7)
    runs = []
    for async_on in (False, True):
        llm = LLM(tiny_model_dirs["llama"], num_kvcache_blocks=kv_blocks, async_scheduling=async_on)
        engine, seqs, behind = llm.engine, [], 0
        for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
            behind += engine.aggregated.in_flight is not None
            seqs.append(engine.add_request(prompt, p, f"r{i}"))
            for _ in range(2):
                engine.step()
        while engine.has_unfinished:
            engine.step()
        runs.append([(s.completion_token_ids, s.finish_reason) for s in seqs])
        bm = engine.block_manager
        assert bm.num_free_blocks == bm.num_blocks
        if async_on:
            assert behind >= 4  # most arrivals came while a step was in flight
    assert runs[0] == runs[1]


@pytest.mark.parametrize("kv_blocks", [256, 12])
@pytest.mark.parametrize("switch", ["0", "1"])  # PDSERVE_MIXED_RUN_AHEAD: off by default
def test_mixed_steps_run_ahead(tiny_model_dirs, kv_blocks, switch, monkeypatch):
    """Steps with prompt chunks stay in flight too: chunks that sample nothing (whose next chunk is
    launched behind them), last chunks whose first token is a placeholder, decode rows beside them.
    Answers, finish reasons and returned blocks equal the synchronous loop's, with preemption too."""
    monkeypatch.setenv("PDSERVE_MIXED_RUN_AHEAD", switch)
    rng = random.Random(9)
    prompts = [[rng.randrange(512) for _ in range(rng.randint(3, 90))] for _ in range(10)]
    params = _params(10, 10)
    runs = []
    for async_on in (False, True):
        llm = LLM(
            tiny_model_dirs["llama"],
            num_kvcache_blocks=kv_blocks,
            max_num_batched_tokens=32,  # prompts over 32 tokens take several chunks
            async_scheduling=async_on,
        )
        engine, seqs, mixed_ahead, chunks_ahead = llm.engine, [], 0, 0
        pending = list(enumerate(zip(prompts, params, strict=True)))
        for n in itertools.count():
            if not (pending or engine.has_unfinished):
                break
            if pending and n % 3 == 0:  # arrivals while others prefill and decode
                i, (prompt, p) = pending.pop(0)
                seqs.append(engine.add_request(prompt, p, f"r{i}"))
            result = engine.step()
            step = engine.aggregated.in_flight
            mixed_ahead += step is not None and result.num_prefill_tokens > 0
            chunks_ahead += step is not None and len(step.rows) < len(step.seqs)
        runs.append([(s.completion_token_ids, s.finish_reason) for s in seqs])
        bm = engine.block_manager
        assert bm.num_free_blocks == bm.num_blocks
        if async_on and switch == "1":
            assert mixed_ahead >= 5 and chunks_ahead >= 3, (mixed_ahead, chunks_ahead)
        else:
            assert mixed_ahead == chunks_ahead == 0
    assert runs[0] == runs[1]


def test_launches_ahead_scans_only_rows_the_caller_has_not_checked():
    from types import SimpleNamespace

    from common.core import run_ahead
    from common.core.batch import ScheduledBatch
    from common.core.sequence import Sequence

    plain = Sequence([1, 2, 3], SamplingParams(temperature=0.0), block_size=16)
    reads = Sequence([1, 2, 3], SamplingParams(temperature=0.0, logprobs=1), block_size=16)
    scheduler = SimpleNamespace(config=SimpleNamespace(role="mixed"))
    batch = ScheduledBatch(seqs=[plain, plain, reads], num_decode_tokens=3)
    assert not run_ahead.launches_ahead(batch, scheduler, mixed=False)  # a row reads host tokens
    assert not run_ahead.launches_ahead(batch, scheduler, mixed=False, checked=2)  # the unchecked one
    batch = ScheduledBatch(seqs=[reads, plain], num_decode_tokens=2)
    assert run_ahead.launches_ahead(batch, scheduler, mixed=False, checked=1)  # row 0: the caller's word
