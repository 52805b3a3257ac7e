"""Several router fronts, seen from a worker: each request's messages go to the front that admitted it
(`reply_to`, one TokenBatch per front per step), and when a front's link breaks the worker drops that
front's requests at once (freeing their blocks), refuses new ones naming it until the link is back,
and keeps serving the other front's."""

from __future__ import annotations

from common import SamplingParams
from common.wire.messages import GenerateRequest, TokenBatch, TokenOutput
from common.worker.fronts import FrontStatus
from decode_worker.role import DecodeRole
from tests.unit.decode_worker.cases import PROMPTS
from tests.unit.prefill_worker.harness import make_service, run_until

FRONT_A, FRONT_B = "tcp://127.0.0.1:7001", "tcp://127.0.0.1:7002"


def generate(rid: str, reply_to: str, max_tokens: int = 64) -> GenerateRequest:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return GenerateRequest(rid, PROMPTS[0], params, None, reply_to=reply_to)


def test_messages_go_to_the_admitting_front_and_a_lost_front_frees_its_requests(tiny_model_dirs) -> None:
    worker = make_service(DecodeRole(), tiny_model_dirs["llama"])
    try:
        channels = worker.channels
        worker.handle(generate("a1", FRONT_A))
        worker.handle(generate("b1", FRONT_B, max_tokens=8))
        run_until([worker], lambda: len(channels.of_type(TokenOutput)) >= 6)
        for msg, front in zip(channels.router, channels.reply_tos, strict=True):
            rows = msg.request_ids if isinstance(msg, TokenBatch) else [msg.request_id]
            assert {rid[0] for rid in rows} == {"a" if front == FRONT_A else "b"}
        free_before = worker.engine.load_report().num_free_blocks

        worker.handle(FrontStatus(FRONT_A, up=False))
        assert "a1" not in worker.role.jobs and "b1" in worker.role.jobs
        assert worker.engine.load_report().num_free_blocks > free_before  # a1's blocks are back
        worker.handle(generate("a2", FRONT_A))  # names the lost front: not taken
        assert "a2" not in worker.role.jobs
        run_until([worker], lambda: "b1" not in worker.role.jobs)  # front B's request finishes
        assert channels.of_type(TokenOutput)[-1].finish_reason == "length"

        worker.handle(FrontStatus(FRONT_A, up=True))
        worker.handle(generate("a3", FRONT_A))
        assert "a3" in worker.role.jobs
    finally:
        worker.close()
