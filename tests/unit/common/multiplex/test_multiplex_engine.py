"""Multiplexed mode on the CPU (inline partitions): the same tokens as the aggregated engine, with
decode steps run ahead (`async_scheduling`, forced on here) and without. On the CPU every launch
completes at once: these check the bookkeeping (placeholders, late stops, deferred frees, aborts,
preemption beside a chunk), not the overlap (tests/unit/common/multiplex/test_gpu_multiplex.py)."""

from __future__ import annotations

import random
import time

import pytest

from common import LLM, SamplingParams
from common.multiplex.inline_budget import DEFAULT_CAP
from common.multiplex.partitions import InlinePartitions
from tests.helpers.counted_run import generate_counted
from tests.helpers.staggered import run_staggered
from tests.unit.common.multiplex.tiny_llm import GREEDY, tiny_llm


def _prompts(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(512) for _ in range(40)]  # a prefix the later prompts hit in the cache
    fresh = [[rng.randrange(512) for _ in range(n)] for n in (3, 17, 70, 101)]
    return fresh + [shared + [rng.randrange(512) for _ in range(n)] for n in (5, 23)] + [shared]


@pytest.mark.parametrize("arch,ahead", [("qwen3", False), ("llama", False), ("qwen3", True)])
def test_greedy_equals_aggregated(tiny_model_dirs, arch, ahead):
    prompts = _prompts()
    plain = tiny_llm(tiny_model_dirs[arch])
    mux = tiny_llm(tiny_model_dirs[arch], pd_multiplex=True, async_scheduling=ahead)
    assert isinstance(mux.engine.multiplexer.partitions, InlinePartitions)
    # Twice: the second round's prompts hit the prefix cache filled by the first.
    for _ in range(2):
        want = [o["token_ids"] for o in plain.generate(prompts, GREEDY, use_tqdm=False)]
        got = [o["token_ids"] for o in mux.generate(prompts, GREEDY, use_tqdm=False)]
        assert got == want
    assert mux.engine.block_manager.num_free_blocks == mux.engine.block_manager.num_blocks


@pytest.mark.parametrize("ahead", [False, True])
def test_staggered_arrivals_equal_aggregated(tiny_model_dirs, ahead):
    prompts = _prompts(1)
    plain = tiny_llm(tiny_model_dirs["qwen3"])
    mux = tiny_llm(tiny_model_dirs["qwen3"], pd_multiplex=True, async_scheduling=ahead)
    assert run_staggered(mux.engine, prompts, GREEDY) == run_staggered(plain.engine, prompts, GREEDY)
    stats = mux.engine.multiplexer.stats
    chunks = sum(stats.chunks_per_lane.values())
    assert stats.decode_steps_beside > 0 and chunks > len(prompts)
    assert chunks < stats.chunk_parts <= 2 * chunks  # chunks beside decode steps came in two parts


@pytest.mark.parametrize("rule", ["knee", "drain"])
def test_the_split_rules_that_read_behind_give_the_same_tokens(tiny_model_dirs, rule):
    prompts = _prompts(1)
    plain = tiny_llm(tiny_model_dirs["qwen3"])
    ratio = 2.0 if rule == "drain" else 0.0  # drain chooses between the solo-ratio target and the cap
    mux = tiny_llm(tiny_model_dirs["qwen3"], pd_multiplex=True, mux_split=rule, itl_target_solo_ratio=ratio)
    controller = mux.engine.multiplexer.controller
    told, next_lane = [], controller.next_lane
    controller.next_lane = lambda decoding, behind: told.append(behind) or next_lane(decoding, behind)
    assert run_staggered(mux.engine, prompts, GREEDY) == run_staggered(plain.engine, prompts, GREEDY)
    assert (controller.config.knee, controller.config.drain) == (rule == "knee", rule == "drain")
    # Chunks of 32 tokens: the 70- and 101-token prompts fill several (prefill behind), the rest do not.
    assert True in told and False in told
    with pytest.raises(ValueError, match="mux_split"):
        tiny_llm(tiny_model_dirs["qwen3"], pd_multiplex=True, mux_split="fast")
    with pytest.raises(ValueError, match="mux_split 'drain' needs itl_target_solo_ratio"):
        tiny_llm(tiny_model_dirs["qwen3"], pd_multiplex=True, mux_split="drain", itl_target_solo_ratio=0)


def test_the_solo_ratio_split_reads_solo_gaps_and_gives_the_same_tokens(tiny_model_dirs):
    prompts = _prompts(1)
    plain = tiny_llm(tiny_model_dirs["qwen3"])
    mux = tiny_llm(tiny_model_dirs["qwen3"], pd_multiplex=True)  # ratio 2, the default
    assert run_staggered(mux.engine, prompts, GREEDY) == run_staggered(plain.engine, prompts, GREEDY)
    controller = mux.engine.multiplexer.controller
    # Decode outputs with no chunk in flight were read: the target is now 2x their median, or the cap.
    assert controller.config.solo_ratio == 2.0 and controller.target < controller.config.itl_target_s
    with pytest.raises(ValueError, match="itl_target_solo_ratio"):
        tiny_llm(tiny_model_dirs["qwen3"], pd_multiplex=True, itl_target_solo_ratio=0.5)


def test_abort_of_a_chunk_in_flight_waits_for_it(tiny_model_dirs):
    mux = tiny_llm(tiny_model_dirs["qwen3"], pd_multiplex=True)
    engine = mux.engine
    engine.add_request([5, 6, 7], GREEDY, request_id="b")
    engine.step()  # b's prompt: nothing decodes, so the chunk is waited for and resolved
    engine.add_request(list(range(1, 80)), GREEDY, request_id="a")
    engine.step()  # a's first chunk is launched, b decodes beside it; resolved by the next step
    assert engine.multiplexer.in_flight
    assert [s.request_id for s in engine.abort(["a", "b"])] == ["b"]  # b now; a is held
    assert [s.request_id for s in engine.scheduler.running] == ["a"]
    while engine.has_unfinished:
        engine.step()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_refuses_what_does_not_combine(tiny_model_dirs):
    with pytest.raises(ValueError, match="speculative"):
        tiny_llm(tiny_model_dirs["qwen3"], pd_multiplex=True, speculative="ngram")
    with pytest.raises(ValueError, match="role"):
        tiny_llm(tiny_model_dirs["qwen3"], pd_multiplex=True, role="prefill")
    mux = tiny_llm(tiny_model_dirs["qwen3"], pd_multiplex=True)
    with pytest.raises(ValueError, match="layers_per_part"):
        mux.engine.runner.launch_side([], mux.engine.multiplexer.partitions.lanes[0], 0)


def _mixed_params(n: int, seed: int) -> list[SamplingParams]:
    """Greedy and seeded sampling, lengths from 1 token (a stop at the first) to 30, EOS stops."""
    rng = random.Random(seed)
    return [
        SamplingParams(temperature=rng.choice([0.0, 0.8]), seed=i, max_tokens=rng.randint(1, 30))
        for i in range(n)
    ]


@pytest.mark.parametrize("kv_blocks", [256, 12])  # 12 blocks of 16 forces preemption
def test_run_ahead_matches_aggregated(tiny_model_dirs, kv_blocks):
    rng = random.Random(4)
    prompts = [[rng.randrange(512) for _ in range(rng.randint(3, 60))] for _ in range(10)]
    params = _mixed_params(10, 5)
    runs, preempted = [], 0
    for mux in (False, True):
        llm = LLM(
            tiny_model_dirs["llama"],
            num_kvcache_blocks=kv_blocks,
            max_num_batched_tokens=32,
            pd_multiplex=mux,
            async_scheduling=mux,
        )
        if mux:
            llm.engine.multiplexer.layers_per_part = 1
        run, count = generate_counted(llm, prompts, params)  # every block came back
        runs.append(run)
        preempted += count
    assert runs[1] == runs[0]
    assert "stop" in {reason for _, reason in runs[0]}
    assert (preempted > 0) == (kv_blocks == 12)


def test_abort_beside_a_run_ahead_step(tiny_model_dirs):
    mux = tiny_llm(tiny_model_dirs["qwen3"], pd_multiplex=True, async_scheduling=True)
    engine = mux.engine
    for rid in ("b", "c"):
        engine.add_request([5, 6, 7], GREEDY, request_id=rid)
    engine.step()  # b and c prefilled together (nothing decodes: waited for)
    engine.step()  # their first decode step is launched and stays in flight
    engine.add_request(list(range(1, 80)), GREEDY, request_id="a")
    engine.step()  # a's chunk starts; the next decode step runs ahead of the first
    assert engine.multiplexer.chunk_in_flight and engine.multiplexer.in_flight
    assert sorted(s.request_id for s in engine.abort(["a", "b"])) == ["b"]
    done = {}
    while engine.has_unfinished:
        for u in engine.step().updates:
            done.setdefault(u.seq.request_id, []).append(u.new_token_id)
    assert "b" not in done and len(done["c"]) > 0
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_layers_per_part_comes_from_the_environment(tiny_model_dirs, monkeypatch):
    from common.multiplex.launch_knobs import layers_per_part

    assert layers_per_part() is None  # unset: chunks launched whole
    monkeypatch.setenv("PDSERVE_MUX_LAYERS_PER_PART", "1")
    assert tiny_llm(tiny_model_dirs["qwen3"], pd_multiplex=True).engine.multiplexer.layers_per_part == 1
    monkeypatch.setenv("PDSERVE_MUX_LAYERS_PER_PART", "-2")
    with pytest.raises(ValueError, match="PDSERVE_MUX_LAYERS_PER_PART"):
        layers_per_part()


@pytest.mark.parametrize("after,ahead", [(True, False), (True, True), (False, True)])
def test_a_chunk_held_for_the_decode_step_starts_after_it_with_the_same_tokens(
    tiny_model_dirs, monkeypatch, after, ahead
):
    monkeypatch.setenv("PDSERVE_MUX_CHUNK_AFTER_DECODE", "1" if after else "0")
    prompts = _prompts(1)
    plain = tiny_llm(tiny_model_dirs["qwen3"])
    mux = tiny_llm(tiny_model_dirs["qwen3"], pd_multiplex=True, async_scheduling=ahead)
    engine, steps = mux.engine, mux.engine.multiplexer
    assert steps.chunk_after_decode is after
    order: list[str] = []  # per engine step: "|", then the decode launch and a chunk's first part
    decode_launch, engine_step = engine.runner.launch, engine.step
    decode_ends: list[float] = [0.0]  # when this step's decode launch returned (0: none yet)

    def launch_decode(*a, **k):
        order.append("decode")
        out = decode_launch(*a, **k)
        decode_ends[-1] = time.perf_counter()
        return out

    engine.runner.launch = launch_decode
    engine.step = lambda: order.append("|") or decode_ends.append(0.0) or engine_step()
    lane = steps.partitions.lanes[0]
    first_part = lane.activate
    timed_from: list[bool] = []  # per chunk started in a decoding step: timed from after the decode launch

    def start_chunk():
        chunk = steps._chunk
        if decode_ends[-1]:  # its wall time less its scheduling starts after this step's decode launch
            timed_from.append(chunk.began + chunk.host_seconds >= decode_ends[-1])
        order.append("chunk")
        return first_part()

    lane.activate = start_chunk
    lane.resume = first_part  # a chunk's later parts (the inline lane resumes by activating): not logged
    assert run_staggered(engine, prompts, GREEDY) == run_staggered(plain.engine, prompts, GREEDY)
    both = [step for step in "".join(order).split("|") if "decode" in step and "chunk" in step]
    assert both  # chunks were launched beside decode steps
    first = "decode" if after else "chunk"
    assert all(step.startswith(first) for step in both), both
    if after:  # the inline budget's timing of a held chunk leaves out the decode step it waited for
        assert timed_from and all(timed_from), timed_from
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


@pytest.mark.parametrize("ahead,mixed_ahead", [(False, False), (True, False), (True, True)])
def test_inlined_prompts_equal_aggregated(tiny_model_dirs, monkeypatch, ahead, mixed_ahead):
    """Short prompts ride in decode steps, long ones still go to chunks; the tokens do not change."""
    monkeypatch.setenv("PDSERVE_MIXED_RUN_AHEAD", "1" if mixed_ahead else "0")
    prompts = _prompts(2)  # 3 to 101 tokens: the first (3) and the prefix hits' rest fit 24
    plain = tiny_llm(tiny_model_dirs["qwen3"])
    mux = tiny_llm(
        tiny_model_dirs["qwen3"], pd_multiplex=True, async_scheduling=ahead, mux_inline_prompt_tokens=24
    )
    assert mux.engine.multiplexer.mixed_ahead == mixed_ahead
    for every in (1, 2):
        want = run_staggered(plain.engine, prompts, GREEDY, every)
        assert run_staggered(mux.engine, prompts, GREEDY, every) == want
    stats = mux.engine.multiplexer.stats
    assert mux.engine.timings.inline_prompts >= 4 and sum(stats.chunks_per_lane.values()) > 0
    assert mux.engine.block_manager.num_free_blocks == mux.engine.block_manager.num_blocks


def test_inlining_leaves_long_prompts_and_idle_engines_to_chunks(tiny_model_dirs):
    mux = tiny_llm(tiny_model_dirs["qwen3"], pd_multiplex=True, mux_inline_prompt_tokens=8)
    engine = mux.engine
    engine.add_request([5, 6, 7], GREEDY, request_id="b")
    engine.step()  # nothing decodes: b's short prompt is a chunk of its own, waited for
    assert engine.timings.inline_prompts == 0
    engine.add_request(list(range(1, 30)), GREEDY, request_id="long")
    engine.add_request([9, 9, 9, 9], GREEDY, request_id="short")
    engine.step()  # long (29 > 8 tokens) heads the queue: a chunk; short is admitted into it behind
    assert engine.timings.inline_prompts == 0
    engine.add_request([4, 4], GREEDY, request_id="tiny")
    while engine.has_unfinished:
        engine.step()  # tiny heads the queue while b decodes: it rides in a decode step
    assert engine.timings.inline_prompts == 1


def test_short_prompts_waiting_together_ride_in_one_decode_step(tiny_model_dirs):
    mux = tiny_llm(tiny_model_dirs["qwen3"], pd_multiplex=True, mux_inline_prompt_tokens=8)
    engine = mux.engine
    engine.add_request([5, 6, 7], GREEDY, request_id="b")
    engine.step()  # b's prompt (nothing decodes yet)
    for first, rid in enumerate("wxyz"):
        engine.add_request([first + 1, 2, 3, 4, 5, 6, 7, 8], GREEDY, request_id=rid)  # 8 tokens each
    engine.step()  # b decodes: w, x and y fit the 32-token budget less b's row (31), z does not
    assert engine.timings.inline_prompts == 3 and engine.timings.prefill_steps == 1
    assert [s.request_id for s in engine.scheduler.waiting] == ["z"]


def test_inline_prompt_tokens_is_checked(tiny_model_dirs):
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="mux_inline_prompt_tokens"):
            tiny_llm(tiny_model_dirs["qwen3"], pd_multiplex=True, mux_inline_prompt_tokens=bad)


@pytest.mark.parametrize("ahead", [False, True])
def test_a_measured_inline_budget_gives_the_same_tokens(tiny_model_dirs, ahead):
    """With `mux_inline_measured` nothing rides in a decode step before a chunk was measured; after
    that (on the CPU a chunk's launch is its whole computation, so the break-even is about a chunk)
    short prompts do, and the tokens stay the aggregated engine's."""
    prompts = _prompts(3)
    plain = tiny_llm(tiny_model_dirs["qwen3"])
    mux = tiny_llm(
        tiny_model_dirs["qwen3"], pd_multiplex=True, async_scheduling=ahead, mux_inline_measured=True
    )
    budget = mux.engine.multiplexer.inline_budget
    assert budget is not None and budget.tokens == 0 and budget.cap == DEFAULT_CAP
    for every in (1, 2):
        assert run_staggered(mux.engine, prompts, GREEDY, every) == run_staggered(
            plain.engine, prompts, GREEDY, every
        )
    assert budget.tokens > 0 and mux.engine.timings.inline_prompts > 0
    assert mux.engine.block_manager.num_free_blocks == mux.engine.block_manager.num_blocks


def test_inline_measured_is_checked(tiny_model_dirs):
    with pytest.raises(ValueError, match="mux_inline_measured"):
        tiny_llm(tiny_model_dirs["qwen3"], pd_multiplex=True, mux_inline_measured="yes")
