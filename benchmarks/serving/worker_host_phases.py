"""Phase clocks for benchmarks/serving/worker_host.py: functions wrapped in place (restored after), and a
measurement window of steady load.

The engine's phases are decode_host's (benchmarks/engine/decode_host.py: schedule, update_from_output,
prepare_sampling, run_ahead.start, graph fill; the eager forward and the sampler excluded as device work).
The worker's phases wrap the WorkerService loop's calls, the role's hooks and what they call; the I/O
thread's codec calls are timed with that thread's own CPU clock, and the thread's whole CPU time is read
through its pthread CPU clock, so neither depends on how the threads share the two cores.
"""

from __future__ import annotations

import functools
import os
import time
from collections import defaultdict
from collections.abc import Callable

from benchmarks.engine import decode_host
from common.llm_engine import LLMEngine
from common.worker import channels as worker_channels
from common.worker.aborts import AbortBook
from common.worker.events import EventPublisher
from common.worker.io_process import ProcessChannels
from common.worker.service import WorkerService

_MISSING = object()

# (label, depth, owner, attribute): wall-clock phases of the engine thread; a phase of depth d is part
# of the phase of depth d - 1 above it (the table indents it). `loop` is the whole loop turn; owner None
# is the role's class.
WORKER_PHASES = (
    ("loop", 0, WorkerService, "run_once"),
    ("take_commands", 0, WorkerService, "_take_commands"),
    ("submit", 1, None, "submit"),
    ("make_sequence", 2, LLMEngine, "make_sequence"),
    ("validate_token_ids", 3, LLMEngine, "validate_token_ids"),
    ("add_sequence", 2, LLMEngine, "add_sequence"),
    ("poll", 0, None, "poll"),
    ("expire", 0, None, "expire"),
    ("aborts.expire", 0, AbortBook, "expire"),
    ("on_step", 0, None, "on_step"),
    ("after_iteration", 0, None, "after_iteration"),
    ("drain_kv_events", 1, LLMEngine, "drain_kv_events"),
    ("events.flush", 1, EventPublisher, "flush"),
    ("post_load", 0, WorkerService, "_post_load"),
    ("load_report", 1, LLMEngine, "load_report"),
    ("release_wakes (thread)", 0, worker_channels.WorkerChannels, "release_wakes"),
    ("release_wakes (process)", 0, ProcessChannels, "release_wakes"),
)
# Timed on the I/O thread's CPU clock (the codec calls the channels module makes).
IO_PHASES = (("io decode", worker_channels, "decode"), ("io encode", worker_channels, "encode"))


class Clocks:
    """Accumulated seconds per label, and the undo list of every patch made."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.patches: list[tuple[object, str, object]] = []
        self.engine = decode_host.Timer()  # the engine phases, decode_host's way

    @property
    def steps(self) -> int:
        return self.engine.steps

    def wrap(self, owner, name: str, label: str, clock: Callable[[], float] = time.perf_counter) -> None:
        original = getattr(owner, name)
        self.patches.append((owner, name, vars(owner).get(name, _MISSING)))
        totals, calls = self.totals, self.calls

        @functools.wraps(original)
        def timed(*args, **kwargs):
            t0 = clock()
            try:
                return original(*args, **kwargs)
            finally:
                totals[label] += clock() - t0
                calls[label] += 1

        setattr(owner, name, timed)

    def instrument_engine(self, block_size: int) -> None:
        # decode_host patches functions defined where it patches them: restoring them is a plain setattr.
        self.patches += decode_host.instrument(self.engine, block_size)

    def instrument_worker(self, role_cls: type) -> None:
        for label, _, owner, name in WORKER_PHASES:
            self.wrap(owner or role_cls, name, label)
        for label, owner, name in IO_PHASES:
            self.wrap(owner, name, label, clock=time.thread_time)

    def restore(self) -> None:
        for owner, name, original in reversed(self.patches):
            if original is _MISSING:
                delattr(owner, name)  # it was inherited: uncover the base class's again
            else:
                setattr(owner, name, original)
        self.patches.clear()

    def snapshot(self) -> dict[str, float]:
        return {**self.totals, **self.engine.totals, "steps": self.engine.steps}


def thread_cpu_clock(ident: int) -> Callable[[], float]:
    """CPU seconds of the thread `ident` (any thread may read it)."""
    clock_id = time.pthread_getcpuclockid(ident)
    return lambda: time.clock_gettime(clock_id)


def process_cpu_clock(pid: int) -> Callable[[], float]:
    """CPU seconds (user + system, every thread) of the process `pid`, from /proc (10 ms ticks)."""
    tick = os.sysconf("SC_CLK_TCK")

    def read() -> float:
        with open(f"/proc/{pid}/stat") as f:
            after_name = f.read().rsplit(")", 1)[1].split()  # the name may hold spaces
        return (int(after_name[11]) + int(after_name[12])) / tick  # utime, stime

    return read


class Window:
    """The figures between `open()` and `close()`: what the clocks and CPU clocks gained meanwhile."""

    def __init__(self, clocks: Clocks, cpu: dict[str, Callable[[], float]]) -> None:
        self.clocks, self.cpu = clocks, cpu
        self.start: dict[str, float] | None = None
        self.figures: dict[str, float] | None = None

    @property
    def is_open(self) -> bool:
        return self.start is not None and self.figures is None

    def _read(self) -> dict[str, float]:
        cpu = {f"cpu {name}": clock() for name, clock in self.cpu.items()}
        return {**self.clocks.snapshot(), **cpu, "wall": time.perf_counter()}

    def open(self) -> None:
        self.start = self._read()

    def close(self) -> None:
        end, start = self._read(), self.start or {}
        self.figures = {k: v - start.get(k, 0.0) for k, v in end.items()}


def gate(window: Window, running: int, submitted: int, concurrency: int, total: int) -> None:
    """Open the window once the batch is (nearly) full, close it when the last request arrived: from
    then on the batch drains and the load is no longer steady."""
    if window.start is None and running >= 0.9 * concurrency:
        window.open()
    elif window.is_open and submitted >= total:
        window.close()
