"""What the engine reports about its steps and its fill, read by the worker roles, the multiplexed
stepper and the benchmarks: `StepResult` (one step's sequence updates and token counts),
`StepTimings` (where the steps' wall-clock time went), `EngineLoad` (a heartbeat's figures) and
`SequencesFailed` (a step that failed for some requests alone)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from common.core.batch import SeqUpdate
from common.core.sequence import Sequence


@dataclass
class StepTimings:
    """Wall-clock seconds spent in each part of `step()` (cheap; read by benchmarks).

    `device_wait`: of those seconds, the host blocked on a step's tokens; the rest is host work.
    `drains`: run-ahead steps resolved before the next launch, by `run_ahead.Drain` value.
    Multiplexed mode (common/multiplex) also counts the chunks launched beside decode steps on an SM
    share, those shares' SMs and the inter-token targets the split held at their starts summed (the
    means are the sums over the count), and the prompts its decode steps computed inline."""

    schedule: float = 0.0
    prefill_forward: float = 0.0
    decode_forward: float = 0.0
    postprocess: float = 0.0
    prefill_steps: int = 0
    decode_steps: int = 0
    device_wait: float = 0.0
    drains: dict[str, int] = field(default_factory=dict)
    shared_chunks: int = 0
    shared_chunk_sms: int = 0
    shared_chunk_target_ms: float = 0.0
    inline_prompts: int = 0

    def reset(self) -> None:
        """Every counter back to zero, in place: whoever holds this object (the multiplexed stepper
        does) goes on counting into it, which a fresh object in the engine's place would not see."""
        fresh = StepTimings()
        for f in fields(self):
            setattr(self, f.name, getattr(fresh, f.name))

    def account(self, is_decode: bool, t0: float, t1: float, t2: float, t3: float) -> None:
        """One step: scheduled from t0 to t1, launched (forward) until t2, post-processed until t3."""
        self.schedule += t1 - t0
        self.postprocess += t3 - t2
        if is_decode:
            self.decode_forward += t2 - t1
            self.decode_steps += 1
        else:
            self.prefill_forward += t2 - t1
            self.prefill_steps += 1


@dataclass(frozen=True)
class RejectedSequence:
    """A sequence the engine refused after admitting it (its grammar, built aside, was refused): the
    caller fails its request with `error`; it never ran."""

    seq: Sequence
    error: str


@dataclass
class StepResult:
    updates: list[SeqUpdate] = field(default_factory=list)
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_preempted: int = 0
    rejected: list[RejectedSequence] = field(default_factory=list)


class SequencesFailed(Exception):
    """A step failed for the requests `request_ids` alone: the engine stays consistent, keeps serving
    the others, and holds those until the caller aborts them. `result`: the step's outcome up to the
    failure, whose updates still count (a worker sends them); `cause`: the error. Raised where a launch
    kept running out of device memory (common/runner/memory_retry.py): an aggregated step's, or in
    multiplexed mode a prefill chunk's or a decode step's (common/multiplex/stepper.py), whose
    counterpart on the other side goes on, so only that launch's requests fail."""

    def __init__(self, request_ids: frozenset[str], cause: BaseException, result: StepResult | None = None):
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.request_ids = request_ids
        self.cause = cause
        self.result = StepResult() if result is None else result


@dataclass(frozen=True)
class EngineLoad:
    """How full the engine is right now (what a worker's heartbeat reports)."""

    num_free_blocks: int
    num_total_blocks: int
    num_waiting: int
    num_running: int
    num_transferring: int
    queued_prefill_tokens: int
