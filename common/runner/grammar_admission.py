"""Grammar requests wait for their matcher off the engine thread, as vLLM compiles grammars aside.

Building a request's llguidance matcher and its first mask (the lexer over the whole vocabulary) takes
5-70 ms per request on the CPU box (a JSON schema, "any JSON object"), and seconds for a pathological
regex: on the engine thread that is a stall of every stream the worker serves. llguidance releases the
GIL while it builds and masks, so a thread does it (`GrammarMasker.build`) while the engine steps.
Two ways in:
* a new request (`hold`): the engine's `add_sequence` keeps it out of the scheduler until built,
  then it joins the waiting queue;
* a decode worker's copy of a handed-off request (`prebuild`, when its KV blocks are reserved): it sits
  in the scheduler's transferring set while the build and the KV transfer run side by side; if the KV
  arrives first (`arrived`), it joins the running batch once built.
A grammar refused (`build`'s ValueError) comes back as a `RejectedSequence` for the caller to fail
that request alone; a travelling sequence is refused only once its transfer has settled (until then
the transfer may write its blocks).

Invariants: a sequence held for the queue is in no scheduler queue and holds no KV blocks; a built
state is attached to its sequence on the engine thread (`seq.grammar_state`), never by a thread; the
first of admission and a step's mask to make a state keeps it. Sequences join in the order they were
held whenever they are ready together.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum

from common.core.scheduler import Scheduler
from common.core.sequence import Sequence
from common.core.step_records import RejectedSequence
from common.runner.grammar import GrammarMasker, GrammarState
from common.wire.sampling_params import FinishReason

THREADS = 2  # llguidance builds in parallel; two keep a burst of grammar requests moving
# How long a step with nothing else to do waits for a build: the worker loop steps again at once while
# work is unfinished, and would spin.
IDLE_WAIT_S = 0.005


class Wait(StrEnum):
    """Where a sequence waits while its matcher is built, and where it goes once built."""

    QUEUE = "queue"  # out of the scheduler; joins its waiting queue
    TRAVELLING = "travelling"  # in the scheduler's transferring set, its KV on the way: stays there
    ARRIVED = "arrived"  # its KV arrived first: joins the running batch (`Scheduler.complete_transfer`)


@dataclass
class Build:
    seq: Sequence
    future: Future[GrammarState]
    wait: Wait

    def attach(self) -> None:
        """The built state onto the sequence (engine thread), unless a step made one first."""
        if self.seq.grammar_state is None:
            self.seq.grammar_state = self.future.result()


@dataclass
class GrammarOutcome:
    """What `take_ready` found: builds done (their state attached), and those whose grammar was refused."""

    ready: list[Build] = field(default_factory=list)
    rejected: list[Build] = field(default_factory=list)


class GrammarAdmission:
    """See the module docstring. The thread pool starts with the first grammar request."""

    def __init__(self, masker: GrammarMasker, vocab_size: int, threads: int = THREADS) -> None:
        self._masker = masker
        self._vocab_size = vocab_size
        self._threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._held: dict[int, Build] = {}  # seq_id -> its build

    def __len__(self) -> int:
        return len(self._held)

    @property
    def num_queued(self) -> int:
        """Held out of the scheduler (a load report's waiting requests)."""
        return sum(b.wait is Wait.QUEUE for b in self._held.values())

    @property
    def num_joining(self) -> int:
        """Held sequences that join the scheduler's queues once built: work for the engine's steps."""
        return sum(b.wait is not Wait.TRAVELLING for b in self._held.values())

    def hold(self, seq: Sequence) -> None:
        """Build `seq`'s matcher aside; `admit_ready` puts it in the waiting queue."""
        self._submit(seq, Wait.QUEUE)

    def prebuild(self, seq: Sequence) -> None:
        """Build the matcher of `seq`, which awaits its KV in the transferring set (see `arrived`)."""
        self._submit(seq, Wait.TRAVELLING)

    def arrived(self, seq: Sequence) -> bool:
        """`seq`'s KV arrived: True when it may join the running batch now (no build pending, none
        refused); else `admit_ready` completes its transfer once built, or rejects it."""
        build = self._held.get(seq.seq_id)
        if build is None or self._take_built(build):
            return True
        build.wait = Wait.ARRIVED
        return False

    def forget(self, seq: Sequence) -> None:
        """`seq` no longer waits for its build here (its transfer failed and it is recomputed: a step
        that reaches it first makes its matcher)."""
        build = self._held.pop(seq.seq_id, None)
        if build is not None:
            build.future.cancel()

    def _submit(self, seq: Sequence, wait: Wait) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="grammar")
        future = self._pool.submit(self._masker.build, seq, self._vocab_size)
        self._held[seq.seq_id] = Build(seq, future, wait)

    def admit_ready(self, scheduler: Scheduler, busy: bool) -> list[RejectedSequence]:
        """Move the built sequences on; finish (abort) and return those whose grammar was refused.
        `busy`: the engine has other work this step (else wait a little)."""
        outcome = self.take_ready(0.0 if busy else IDLE_WAIT_S)
        for build in outcome.ready:
            if build.wait is Wait.QUEUE:
                scheduler.add(build.seq)
            elif build.wait is Wait.ARRIVED:
                scheduler.complete_transfer(build.seq)
        rejected = []
        for build in outcome.rejected:
            if build.wait is Wait.ARRIVED:
                scheduler.cancel_transfer(build.seq)
            else:
                scheduler.finish(build.seq, FinishReason.ABORT)
            rejected.append(RejectedSequence(build.seq, _reason(build.future.exception())))
        return rejected

    def take_ready(self, wait_s: float = 0.0) -> GrammarOutcome:
        """The builds that finished, taken off the books (a refused travelling one stays until its KV
        arrives); with `wait_s`, wait that long for one (an idle engine would otherwise spin)."""
        outcome = GrammarOutcome()
        if not self._held:
            return outcome
        if wait_s > 0:
            # Only a build whose sequence then joins a queue is worth waiting for (a travelling one
            # waits for its KV anyway), and none if such a build is already done.
            joining = [b.future for b in self._held.values() if b.wait is not Wait.TRAVELLING]
            if not any(f.done() for f in joining):
                futures.wait(joining, timeout=wait_s, return_when=futures.FIRST_COMPLETED)
        for seq_id, build in list(self._held.items()):
            if self._take_built(build):
                outcome.ready.append(build)
            elif build.future.done() and build.wait is not Wait.TRAVELLING:
                del self._held[seq_id]
                outcome.rejected.append(build)
        return outcome

    def _take_built(self, build: Build) -> bool:
        """Off the books with its state attached, if its build succeeded."""
        if not build.future.done() or build.future.exception() is not None:
            return False
        del self._held[build.seq.seq_id]
        build.attach()
        return True

    def abort(self, request_ids: Iterable[str], scheduler: Scheduler) -> list[Sequence]:
        """Stop building for these requests; finish (aborted) and return the sequences held out of the
        scheduler (those in its transferring set are the scheduler's to abort)."""
        wanted = set(request_ids)
        dropped = [b for b in self._held.values() if b.seq.request_id in wanted]
        for build in dropped:
            del self._held[build.seq.seq_id]
            build.future.cancel()
            if build.wait is Wait.QUEUE:
                scheduler.finish(build.seq, FinishReason.ABORT)
        return [b.seq for b in dropped if b.wait is Wait.QUEUE]

    def close(self) -> None:
        """Drop everything held and stop the threads (idempotent)."""
        self._held.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _reason(error: BaseException | None) -> str:
    return str(error) if isinstance(error, ValueError) else f"{type(error).__name__}: {error}"
