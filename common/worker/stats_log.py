"""The worker's periodic stats line (as vLLM's engine logs its throughput every few seconds).

Every `interval_s` of a busy loop, one INFO line: prompt and generated tokens per second, the engine
steps split into pure decode steps (CUDA-graph, run ahead) and steps carrying prompt tokens, the mean
wall time of each kind, the host time the engine spent outside waiting for the device, the loop's time
outside `engine.step` with three of its parts (taking commands, the role turning the step into
messages, handing the turn's messages to the I/O side) and the batch now. Read
with `benchmarks/engine/offline.py`'s step timings: the same counters, so a served worker's steps
compare with the offline engine's on the same model. Idle intervals log nothing. In multiplexed mode
(common/multiplex) the stepper counts each step's wall time as its forward time and does not split
out the device wait, so there "engine host" is the whole step; the line then ends with the chunks
launched beside decode steps, their mean SM share, and the prompts run inline in decode steps. With a
`gc_meter` (the worker process installs one, common/net/gc_heap.py) the line also counts the interval's
garbage collections and the longest: a stall of the loop that shows as a maximum inter-token gap.
Steps recorded with their class (common/multiplex/step_classes.py) add each class's count and the
p50 / p99 / max of its steps' wall time: a stream's inter-token gap is about the wall time of the step
that made its token, so the class holding the long steps is where a served ITL tail comes from.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from common.core.percentile import percentile
from common.core.step_records import EngineLoad, StepTimings
from common.net.gc_heap import GcPauseMeter, GcPauses

log = logging.getLogger(__name__)


@dataclass
class _Totals:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    step_s: float = 0.0  # wall time inside engine.step
    commands_s: float = 0.0  # taking commands while busy (idle waits are not counted)
    role_s: float = 0.0  # role.on_step: the step's tokens as messages
    handoff_s: float = 0.0  # the turn's messages to the I/O thread or process
    step_s_by_class: dict[str, list[float]] = field(default_factory=dict)  # steps recorded with a class


class StatsLog:
    """Accumulates per-step counts from the worker loop; `maybe_log` writes and resets them."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._timings: StepTimings | None = None  # the engine's counters, from the first record
        self._since = time.perf_counter()
        self._start: dict = {}  # the engine's counters at the start of the interval
        self._now = _Totals()
        self.gc_meter: GcPauseMeter | None = None  # set by the process that installed one

    def record(
        self,
        timings: StepTimings,
        prompt_tokens: int,
        generated_tokens: int,
        step_s: float,
        step_class: str | None = None,
    ) -> None:
        """One engine step: `timings` are the engine's cumulative counters after it; `step_class`, what
        the step did besides decoding (`StepClassifier`)."""
        if self._timings is None:
            self._timings = timings
            self._start = asdict(timings)
        now = self._now
        now.prompt_tokens += prompt_tokens
        now.generated_tokens += generated_tokens
        now.step_s += step_s
        if step_class is not None and self.interval_s > 0:  # with no line nothing takes (and clears) them
            now.step_s_by_class.setdefault(step_class, []).append(step_s)

    def record_loop(self, commands_s: float, role_s: float, handoff_s: float) -> None:
        """The parts of one loop turn outside `engine.step` (each 0 when the turn had none)."""
        now = self._now
        now.commands_s += commands_s
        now.role_s += role_s
        now.handoff_s += handoff_s

    def maybe_log(self, load: Callable[[], EngineLoad]) -> None:
        """Log the interval's line once `interval_s` has passed (`load`: called only then)."""
        if self.interval_s <= 0:
            return
        elapsed = time.perf_counter() - self._since
        if elapsed < self.interval_s:
            return
        pauses = self.gc_meter.take() if self.gc_meter is not None else None
        if self._timings is not None and (self._now.prompt_tokens or self._now.generated_tokens):
            log.info("%s", self.line(elapsed, load(), pauses))
        self._since += elapsed
        if self._timings is not None:
            self._start = asdict(self._timings)
        self._now = _Totals()

    def line(self, elapsed: float, load: EngineLoad, pauses: GcPauses | None = None) -> str:
        now, start, t = self._now, self._start, asdict(self._timings)
        d = {k: t[k] - start.get(k, 0) for k in t if not isinstance(t[k], dict)}
        decode, prompt = int(d["decode_steps"]), int(d["prefill_steps"])
        steps = max(decode + prompt, 1)
        busy = d["schedule"] + d["prefill_forward"] + d["decode_forward"] + d["postprocess"]
        host = busy - d["device_wait"]
        parts = (
            f"prompt {now.prompt_tokens / elapsed:,.0f} tok/s",
            f"generated {now.generated_tokens / elapsed:,.0f} tok/s",
            f"steps: {decode} decode ({_ms(d['decode_forward'], decode)} ms)",
            f"{prompt} with prompt tokens ({_ms(d['prefill_forward'], prompt)} ms)",
            f"per step: engine host {_ms(host, steps)} ms",
            f"device wait {_ms(d['device_wait'], steps)} ms",
            f"loop outside the engine {_ms(elapsed - now.step_s, steps)} ms"
            f" (commands {_ms(now.commands_s, steps)}, role {_ms(now.role_s, steps)},"
            f" hand-off {_ms(now.handoff_s, steps)})",
            f"running {load.num_running}, waiting {load.num_waiting}",
        )
        return ", ".join(parts + _step_classes(now.step_s_by_class) + _multiplexed(d) + _collections(pauses))


def _multiplexed(d: dict) -> tuple[str, ...]:
    """Multiplexed mode's part of the line, when it launched chunks beside decode or inlined prompts."""
    chunks = int(d["shared_chunks"])
    if not chunks and not d["inline_prompts"]:
        return ()
    mean = "mean share - SMs"
    if chunks:
        share, target = d["shared_chunk_sms"] / chunks, d["shared_chunk_target_ms"] / chunks
        mean = f"mean share {share:.0f} SMs, target {target:.1f} ms"
    return (f"chunks beside decode {chunks} ({mean}), inline prompts {int(d['inline_prompts'])}",)


def _step_classes(by_class: dict[str, list[float]]) -> tuple[str, ...]:
    """Each class's steps, the most frequent first: count, p50 / p99 / max wall time in ms."""
    if not by_class:
        return ()
    cells = [
        f"{name} {len(seconds)} ({1e3 * percentile(seconds, 50):.2f} / {1e3 * percentile(seconds, 99):.2f}"
        f" / {1e3 * max(seconds):.2f})"
        for name, seconds in sorted(by_class.items(), key=lambda item: -len(item[1]))
    ]
    return ("step ms by class, p50 / p99 / max: " + "; ".join(cells),)


def _collections(pauses: GcPauses | None) -> tuple[str, ...]:
    if pauses is None:
        return ()
    return (
        f"gc {pauses.collections} collections ({pauses.full_collections} full), "
        f"{1e3 * pauses.total_s:.1f} ms, longest {1e3 * pauses.max_s:.1f} ms",
    )


def _ms(seconds: float, n: int) -> str:
    return f"{1e3 * seconds / n:.2f}" if n else "-"
