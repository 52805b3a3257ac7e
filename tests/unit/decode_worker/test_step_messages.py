"""How one engine step becomes messages (DecodeRole.on_step, the worker's hot path): plain tokens as
TokenBatch rows, a request's first and last message and any with logprobs as TokenOutputs, every
request's positions counted right even when a step reports several tokens of one request, and every
message as the router decodes it (the rows are built without per-field checks: the router's decode
runs them all)."""

from __future__ import annotations

from common import SamplingParams
from common.core.batch import SeqUpdate
from common.core.step_records import StepResult
from common.wire.codec import decode, encode
from common.wire.logprobs import TokenLogprob
from common.wire.messages import GenerateRequest, TokenBatch, TokenOutput
from common.wire.sampling_params import FinishReason
from decode_worker.role import DecodeRole
from tests.unit.decode_worker.cases import PROMPTS
from tests.unit.prefill_worker.harness import make_service


def _generate(rid: str, **sampling) -> GenerateRequest:
    params = SamplingParams(**{"temperature": 0.0, "max_tokens": 64, "ignore_eos": True, **sampling})
    return GenerateRequest(rid, PROMPTS[0], params, None)


def _sent(channels) -> list[TokenOutput]:
    """What the router gets, decoded with every check, as rows."""
    out = []
    for msg in channels.router:
        got = decode(encode(msg))
        out += got.outputs() if isinstance(got, TokenBatch) else [got]
    return out


def test_one_step_with_first_plain_repeated_logprob_and_last_tokens(tiny_model_dirs) -> None:
    worker = make_service(DecodeRole(), tiny_model_dirs["llama"])
    try:
        role, channels = worker.role, worker.channels
        for rid, extra in (
            ("first", {}),
            ("plain", {}),
            ("twice", {}),
            ("lp", {"logprobs": 0}),
            ("last", {}),
        ):
            worker.handle(_generate(rid, **extra))
        seqs = {rid: job.seq for rid, job in role.jobs.items()}
        for rid in ("plain", "twice", "lp", "last"):  # their first message is out: index 0, one token
            role.on_step(StepResult(updates=[SeqUpdate(seqs[rid], 11, False)]))
            seqs[rid].logprobs = [TokenLogprob(-0.5)] * 4  # what the steps would have recorded for "lp"
        channels.router.clear()
        seqs["last"].finish_reason = FinishReason.LENGTH  # what the scheduler sets as it finishes it

        role.on_step(
            StepResult(
                updates=[
                    SeqUpdate(seqs["plain"], 21, False),
                    SeqUpdate(seqs["twice"], 22, False),
                    SeqUpdate(seqs["first"], 23, False),
                    SeqUpdate(seqs["twice"], 24, False),  # a second token of one request in this step
                    SeqUpdate(seqs["lp"], 25, False),
                    SeqUpdate(seqs["last"], 26, True),
                    SeqUpdate(seqs["plain"], None, False),  # a prompt chunk: no token
                ]
            )
        )
        batches = [m for m in channels.router if isinstance(m, TokenBatch)]
        assert len(batches) == 1 and batches[0].request_ids == ["plain", "twice", "twice"]
        rows = {(m.request_id, m.index): m for m in _sent(channels)}
        assert sorted((rid, i, m.token_ids) for (rid, i), m in rows.items()) == [
            ("first", 0, [23]),
            ("last", 1, [26]),
            ("lp", 1, [25]),
            ("plain", 1, [21]),
            ("twice", 1, [22]),
            ("twice", 2, [24]),
        ]
        assert rows[("lp", 1)].logprobs == [TokenLogprob(-0.5)]
        assert rows[("first", 0)].timings is not None  # a first message carries its stage figures
        assert rows[("last", 1)].finish_reason == FinishReason.LENGTH and "last" not in role.jobs
        assert role.jobs["twice"].next_index == 3 and role.jobs["first"].next_index == 1
    finally:
        worker.close()
