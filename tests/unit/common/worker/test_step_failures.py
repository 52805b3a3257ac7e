"""The worker loop when an engine step fails for some requests alone (`SequencesFailed`: a multiplexed
prefill chunk that kept running out of device memory): the service sends the step's tokens, fails those
requests (retryably, to the front that admitted them) and keeps the others; a real tiny multiplexed
engine on the CPU, the role's request bookkeeping and the front replaced by records."""

from __future__ import annotations

from types import SimpleNamespace

from common.config import EngineConfig
from common.core.step_records import StepResult
from common.worker.config import WorkerConfig
from common.worker.service import WorkerService
from decode_worker.role import MixedRole
from tests.helpers.out_of_memory import parts_running_out_of_memory
from tests.unit.common.multiplex.tiny_llm import GREEDY, tiny_llm


class RecordingFront:
    """The role's context: what it would send to the fronts."""

    def __init__(self) -> None:
        self.failed: list[tuple[str, bool, str | None]] = []

    def fail(self, request_id, error, retryable, reply_to, invalid=False) -> None:
        assert "OutOfMemoryError" in error and not invalid
        self.failed.append((request_id, retryable, reply_to))


class StepRecordingRole(MixedRole):
    """The mixed role's failure handling (`fail_request`, `reject`) as it is; its requests and token
    messages replaced by records."""

    def __init__(self, engine) -> None:
        super().__init__()
        self.engine = engine
        self.ctx = RecordingFront()  # type: ignore[assignment]
        self.tokens: dict[str, list[int]] = {"a": [], "b": []}

    def hold(self, request_id: str, reply_to: str) -> None:
        self.jobs[request_id] = SimpleNamespace(request=SimpleNamespace(reply_to=reply_to))

    def abort(self, request_id: str) -> bool:
        self.jobs.pop(request_id, None)
        return bool(self.engine.abort([request_id]))

    def on_step(self, result: StepResult) -> None:
        for u in result.updates:
            if u.new_token_id is not None:
                self.tokens[u.seq.request_id].append(u.new_token_id)
            if u.finished:
                self.jobs.pop(u.seq.request_id, None)


def test_a_chunk_past_its_retries_fails_its_request_alone(tiny_model_dirs, monkeypatch):
    mux = tiny_llm(tiny_model_dirs["qwen3"], pd_multiplex=True, async_scheduling=True)
    engine = mux.engine
    config = WorkerConfig("m0", "tcp://127.0.0.1:9", EngineConfig(tiny_model_dirs["qwen3"], role="mixed"))
    role = StepRecordingRole(engine)
    service = WorkerService(config, role)
    service.engine = engine
    engine.add_request([5, 6, 7], GREEDY, request_id="b")
    role.hold("b", "tcp://front-1")
    service._step()  # b prefilled: it decodes beside a's chunks
    retries = engine.multiplexer.memory_retries.max_retries
    raised = parts_running_out_of_memory(monkeypatch, engine.runner.model, times=retries + 1)
    engine.add_request(list(range(1, 40)), GREEDY, request_id="a")
    role.hold("a", "tcp://front-2")
    for _ in range(10 * (retries + 1)):
        if role.ctx.failed:
            break
        service._step()
    assert raised[0] == retries + 1
    assert role.ctx.failed == [("a", True, "tcp://front-2")]  # retryable, to the front that admitted it
    assert "a" not in role.jobs and "b" in role.jobs
    while engine.has_unfinished:
        service._step()
    plain = tiny_llm(tiny_model_dirs["qwen3"]).generate([[5, 6, 7]], GREEDY, use_tqdm=False)
    assert role.tokens["b"] == plain[0]["token_ids"] and role.tokens["a"] == []
    assert not role.jobs and role.ctx.failed == [("a", True, "tcp://front-2")]
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    line = service.stats.line(1.0, engine.load_report())  # the service classed the steps it ran
    assert "step ms by class" in line and "solo" in line and "launch" in line
