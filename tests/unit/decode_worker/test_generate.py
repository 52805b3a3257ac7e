"""Decode and mixed workers serving GenerateRequest (prefill here, then decode) on a real tiny engine:
greedy tokens equal the offline engine's from index 0, prefix hits are reported, GenerateRequest and
hand-offs from a prefill worker share one engine, bad input and deadlines fail the way a prefill
worker's would, and only a mixed worker publishes its cache."""

from __future__ import annotations

import time

import msgpack
import pytest

from common import SamplingParams
from common.wire.cache_messages import KVEventBatch, Snapshot, SnapshotRequest
from common.wire.hashing import block_hashes
from common.wire.kv_events import BlockStored
from common.wire.messages import Abort, GenerateRequest, MessageError, RequestFailed, TokenOutput, decode
from common.wire.structured_output import regex_grammar
from decode_worker.role import DecodeRole, MixedRole
from prefill_worker.role import PrefillRole
from tests.unit.decode_worker.cases import MAX_TOKENS, PROMPTS
from tests.unit.prefill_worker.harness import Pair, make_service, prefill_request, run_until


@pytest.fixture(params=[DecodeRole, MixedRole], ids=["decode", "mixed"])
def worker(request, tiny_model_dirs):
    service = make_service(request.param(), tiny_model_dirs["llama"])
    yield service
    service.close()


def generate(rid: str, prompt: list[int], deadline: float | None = None, **sampling) -> GenerateRequest:
    params = {"temperature": 0.0, "max_tokens": MAX_TOKENS, "ignore_eos": True, **sampling}
    return GenerateRequest(rid, prompt, SamplingParams(**params), deadline)


def outputs(service, rid: str) -> list[TokenOutput]:
    return [o for o in service.channels.of_type(TokenOutput) if o.request_id == rid]


def finished(service, rid: str) -> bool:
    failed = any(m.request_id == rid for m in service.channels.of_type(RequestFailed))
    return failed or any(o.finish_reason is not None for o in outputs(service, rid))


def tokens(service, rid: str) -> list[int]:
    return [t for o in outputs(service, rid) for t in o.token_ids]


def run(service, rids: list[str], timeout: float = 60.0) -> None:
    run_until([service], lambda: all(finished(service, rid) for rid in rids), timeout)


def test_generate_matches_the_offline_engine(worker, reference) -> None:
    rids = [f"r{i}" for i in range(len(PROMPTS))]
    for rid, prompt in zip(rids, PROMPTS, strict=True):
        worker.handle(generate(rid, prompt))
    run(worker, rids)
    assert [tokens(worker, rid) for rid in rids] == reference
    for rid, prompt in zip(rids, PROMPTS, strict=True):
        outs = outputs(worker, rid)
        indices = [o.index for o in outs]
        assert indices[0] == 0 and indices == sorted(indices)
        assert [o.index for o in outs[1:]] == [o.index + len(o.token_ids) for o in outs[:-1]]
        assert outs[-1].finish_reason == "length" and outs[0].num_prompt_tokens == len(prompt)
    assert not worker.engine.has_unfinished
    assert worker.engine.load_report().num_free_blocks == 64


def test_a_repeated_prefix_is_reported_as_cached(worker, reference) -> None:
    for rid in ("a", "b"):
        worker.handle(generate(rid, PROMPTS[2]))
        run(worker, [rid])
    first_a, first_b = outputs(worker, "a")[0], outputs(worker, "b")[0]
    assert (first_a.cached_tokens, first_b.cached_tokens) == (0, 32)  # 2 full blocks of the 40 tokens
    assert all(o.cached_tokens == 0 for o in outputs(worker, "b")[1:])
    assert tokens(worker, "a") == tokens(worker, "b") == reference[2]


def test_generate_and_handed_off_requests_share_the_engine(tiny_model_dirs, reference) -> None:
    model = tiny_model_dirs["llama"]
    pair = Pair(make_service(PrefillRole(), model), make_service(MixedRole(), model))
    try:
        pair.prefill.handle(prefill_request("h", PROMPTS[3], max_tokens=MAX_TOKENS, ignore_eos=True))
        pair.decode.handle(generate("g", PROMPTS[3]))
        pair.run(["h", "g"])
        assert pair.tokens("h") == pair.tokens("g") == reference[3]
        assert [o.index for o in outputs(pair.decode, "h")][0] == 1  # index 0 came from prefill
        assert outputs(pair.decode, "g")[0].index == 0
    finally:
        pair.close()


def test_first_token_can_finish_the_request(worker, reference) -> None:
    worker.handle(generate("r1", PROMPTS[1], max_tokens=1))
    run(worker, ["r1"])
    (out,) = outputs(worker, "r1")
    assert (out.index, out.token_ids, out.finish_reason) == (0, reference[1][:1], "length")


@pytest.mark.parametrize(
    "prompt", [[999_999], [1] * 5000], ids=["token-outside-vocab", "longer-than-the-cache"]
)
def test_invalid_requests_fail_without_retry_and_the_worker_keeps_serving(worker, reference, prompt) -> None:
    worker.handle(generate("bad", prompt))
    (failed,) = worker.channels.of_type(RequestFailed)
    assert failed.request_id == "bad" and failed.retryable is False
    assert worker.role.jobs == {} and not worker.engine.has_unfinished
    worker.handle(generate("ok", PROMPTS[0]))
    run(worker, ["ok"])
    assert tokens(worker, "ok") == reference[0]


def test_a_grammar_refused_where_it_is_built_fails_as_invalid(worker, reference) -> None:
    """Built aside while the engine steps (the tiny model ships no tokenizer, so it is refused there):
    the front hears an invalid, final failure, and the request beside it is served."""
    worker.handle(generate("bad", PROMPTS[1], grammar=regex_grammar("[a-z]+")))
    worker.handle(generate("ok", PROMPTS[0]))
    run(worker, ["bad", "ok"])
    (failed,) = worker.channels.of_type(RequestFailed)
    assert failed.request_id == "bad" and failed.invalid and not failed.retryable
    assert "grammar needs a tokenizer" in failed.error and outputs(worker, "bad") == []
    assert tokens(worker, "ok") == reference[0] and "bad" not in worker.role.jobs


@pytest.mark.parametrize(
    "sampling", [{"max_tokens": 0}, {"bogus": 1}], ids=["bad-max-tokens", "unknown-field"]
)
def test_bad_sampling_cannot_reach_a_worker(sampling) -> None:
    """Sampling is a typed value: a bad one fails where the message is built (or decoded), never in
    the worker's engine."""
    with pytest.raises((ValueError, TypeError)):
        GenerateRequest("bad", PROMPTS[0], SamplingParams(**{"max_tokens": 4, **sampling}), None)
    wire = msgpack.packb(
        {
            "type": "generate_request",
            "request_id": "bad",
            "prompt_token_ids": PROMPTS[0],
            "sampling": {"max_tokens": 4, **sampling},
            "deadline": None,
        }
    )
    with pytest.raises(MessageError):
        decode(wire)


def test_duplicate_request_is_ignored(worker, reference) -> None:
    worker.handle(generate("r1", PROMPTS[1]))
    worker.handle(generate("r1", PROMPTS[1]))
    run(worker, ["r1"])
    assert tokens(worker, "r1") == reference[1]


def test_deadline_before_the_first_token_fails_the_request(worker) -> None:
    worker.handle(generate("r1", PROMPTS[2], deadline=time.time() - 1))
    worker.run_once()
    (failed,) = worker.channels.of_type(RequestFailed)
    assert "deadline" in failed.error and not failed.retryable
    assert outputs(worker, "r1") == [] and not worker.engine.has_unfinished


def test_deadline_after_tokens_ends_with_abort(worker) -> None:
    worker.handle(generate("r1", PROMPTS[2], deadline=time.time() + 0.3, max_tokens=900))
    run(worker, ["r1"], timeout=30)
    last = outputs(worker, "r1")[-1]
    assert last.finish_reason == "abort" and last.token_ids == [] and last.index > 0
    assert len(tokens(worker, "r1")) == last.index
    assert not worker.engine.has_unfinished


def test_abort_frees_the_blocks(worker) -> None:
    worker.handle(generate("r1", PROMPTS[3], max_tokens=900))
    run_until([worker], lambda: outputs(worker, "r1"))
    worker.handle(Abort("r1"))
    worker.handle(Abort("r1"))  # idempotent
    assert worker.role.jobs == {} and not worker.engine.has_unfinished
    assert worker.engine.load_report().num_free_blocks == 64
    worker.handle(generate("r1", PROMPTS[3]))  # a late duplicate after the abort is dropped
    assert worker.role.jobs == {}


def test_logprobs_travel_in_the_wire_form(worker) -> None:
    worker.handle(generate("r1", PROMPTS[1], max_tokens=4, logprobs=2))
    run(worker, ["r1"])
    entries = [e for o in outputs(worker, "r1") for e in o.logprobs]
    assert len(entries) == 4
    for entry, token in zip(entries, tokens(worker, "r1"), strict=True):
        assert entry.logprob <= 0 and entry.top[0][0] == token


def test_an_engine_error_fails_generate_requests_retryably(worker, monkeypatch) -> None:
    def broken_step():
        raise RuntimeError("device fell over")

    monkeypatch.setattr(worker.engine, "step", broken_step)
    worker.handle(generate("r1", PROMPTS[1]))
    worker.run_once()
    (failed,) = worker.channels.of_type(RequestFailed)
    assert failed.retryable and "device fell over" in failed.error and worker.role.jobs == {}


def test_only_a_mixed_worker_publishes_its_cache(worker) -> None:
    worker.handle(generate("r1", PROMPTS[2]))
    run(worker, ["r1"])
    worker.handle(SnapshotRequest(worker.config.worker_id))
    events, snapshots = worker.channels.events, worker.channels.of_type(Snapshot)
    if worker.role.name == "decode":
        assert events == [] and snapshots == []
        return
    stored = [h for b in events for e in b.events if isinstance(e, BlockStored) for h in e.hashes]
    assert all(isinstance(b, KVEventBatch) for b in events)
    assert [b.seq for b in events] == list(range(1, len(events) + 1))
    assert stored[:2] == block_hashes(PROMPTS[2], 16)  # the prompt's full blocks, as soon as computed
    (snap,) = snapshots
    assert snap.seq == events[-1].seq and set(snap.hashes) == set(stored)
