"""The engine's worker-role verbs (common/llm_engine.py, "worker roles" section) on real tiny engines:
a prefill engine hands a prompt's blocks over, they are copied by hand into a decode engine's reserved
blocks, and the decode engine continues exactly as the offline engine would; a failed transfer is
recomputed; the load figures follow each step."""

from __future__ import annotations

import pytest

from common import LLM, SamplingParams
from common.config import EngineConfig
from common.llm_engine import LLMEngine
from common.wire.hashing import block_hashes

PROMPT = [(i * 37 + 11) % 500 for i in range(40)]  # 2 full blocks of 16 + 8 tokens
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module")
def reference(tiny_model_dirs) -> list[int]:
    llm = LLM(tiny_model_dirs["llama"], num_kvcache_blocks=32)
    return llm.generate([PROMPT], GREEDY, use_tqdm=False)[0]["token_ids"]


def engine(model: str, role: str) -> LLMEngine:
    return LLMEngine.from_config(EngineConfig(model, role=role, num_kvcache_blocks=32))


def finish(eng: LLMEngine) -> None:
    while eng.has_unfinished:
        eng.step()


def prefill_one(model: str):
    """A prefill engine that has computed PROMPT and handed it off: (engine, sequence, first token)."""
    pre = engine(model, "prefill")
    seq = pre.add_request(PROMPT, GREEDY, "r1")
    (update,) = pre.step().updates
    assert update.handed_off
    return pre, seq, update.new_token_id


def test_handoff_then_transfer_by_hand_matches_the_offline_engine(tiny_model_dirs, reference) -> None:
    model = tiny_model_dirs["llama"]
    pre, src_seq, first = prefill_one(model)
    src_blocks = pre.prompt_block_ids(src_seq)
    assert len(src_blocks) == 3 and pre.block_size == 16
    assert sorted(pre.cached_hashes()) == sorted(block_hashes(PROMPT, 16))
    dec = engine(model, "decode")
    seq = dec.make_sequence([*PROMPT, first], GREEDY, "r1", num_prompt_tokens=len(PROMPT))
    assert dec.reserve_transfer(seq)
    load = dec.load_report()
    assert (load.num_transferring, load.num_free_blocks, load.num_total_blocks) == (1, 29, 32)
    dst_blocks = dec.prompt_block_ids(seq)
    dec.kv_cache[:, :, dst_blocks] = pre.kv_cache[:, :, src_blocks]
    dec.complete_transfer(seq)
    pre.release_handoff(src_seq)
    assert pre.load_report().num_free_blocks == 32 and not pre.has_unfinished  # cached, unpinned
    assert dec.load_report().num_running == 1
    finish(dec)
    assert seq.completion_token_ids == reference


def test_failed_transfer_is_recomputed(tiny_model_dirs, reference) -> None:
    dec = engine(tiny_model_dirs["llama"], "decode")
    seq = dec.make_sequence([*PROMPT, reference[0]], GREEDY, "r1", num_prompt_tokens=len(PROMPT))
    assert dec.reserve_transfer(seq)
    dec.fail_transfer(seq)
    load = dec.load_report()
    assert (load.num_transferring, load.num_waiting, load.num_free_blocks) == (0, 1, 32)
    assert load.queued_prefill_tokens == len(PROMPT) + 1
    finish(dec)
    assert seq.completion_token_ids == reference


def test_reserve_waits_for_room(tiny_model_dirs) -> None:
    dec = LLMEngine.from_config(EngineConfig(tiny_model_dirs["llama"], role="decode", num_kvcache_blocks=4))
    a, b = (dec.make_sequence([*PROMPT, 1], GREEDY, rid, num_prompt_tokens=40) for rid in "ab")
    assert dec.reserve_transfer(a)
    assert not dec.reserve_transfer(b) and b.block_table == []  # 3 + 3 blocks > 4: nothing taken
    dec.fail_transfer(a)
    assert dec.reserve_transfer(b)


def test_add_sequence_runs_a_prompt_in_the_decode_role(tiny_model_dirs, reference) -> None:
    dec = engine(tiny_model_dirs["llama"], "decode")
    seq = dec.make_sequence(PROMPT, GREEDY, "r1")
    dec.add_sequence(seq)
    assert dec.load_report().queued_prefill_tokens == len(PROMPT)
    finish(dec)
    assert seq.completion_token_ids == reference
    assert sorted(dec.cached_hashes()) == sorted(block_hashes([*PROMPT, *reference], 16)[:3])
