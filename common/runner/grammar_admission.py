"""Grammar requests wait for their matcher off the engine thread, as vLLM compiles grammars aside.

Building a request's llguidance matcher and its first mask (the lexer over the whole vocabulary) takes
5-70 ms per request on the CPU box (a JSON schema, "any JSON object"), and seconds for a pathological
regex: on the engine thread that is a stall of every stream the worker serves. llguidance releases the
GIL while it builds and masks, so a thread does it (`GrammarMasker.check`) while the engine steps; the
engine's `add_sequence` holds such a sequence here and each `step` admits the ready ones to the
scheduler. A grammar refused there (`check`'s ValueError) comes back as a `RejectedSequence` for the
caller to fail that request alone.

Invariants: a held sequence is in no scheduler queue and holds no KV blocks; once its future is done
only the engine thread touches it (the future is the hand-over). Sequences are admitted in the order
they were held whenever they are ready together.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from common.core.scheduler import Scheduler
from common.core.sequence import Sequence
from common.core.step_records import RejectedSequence
from common.runner.grammar import GrammarMasker
from common.wire.sampling_params import FinishReason

THREADS = 2  # llguidance builds in parallel; two keep a burst of grammar requests moving
# How long a step with nothing else to do waits for a build: the worker loop steps again at once while
# work is unfinished, and would spin.
IDLE_WAIT_S = 0.005


@dataclass
class GrammarOutcome:
    """What `take_ready` found: sequences to schedule now, and those whose grammar was refused."""

    ready: list[Sequence] = field(default_factory=list)
    rejected: list[RejectedSequence] = field(default_factory=list)


class GrammarAdmission:
    """See the module docstring. The thread pool starts with the first grammar request."""

    def __init__(self, masker: GrammarMasker, vocab_size: int, threads: int = THREADS) -> None:
        self._masker = masker
        self._vocab_size = vocab_size
        self._threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._held: dict[int, tuple[Sequence, Future]] = {}  # seq_id -> (sequence, its build)

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, seq: Sequence) -> None:
        """Build `seq`'s matcher aside; `take_ready` hands it back."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="grammar")
        self._held[seq.seq_id] = (seq, self._pool.submit(self._masker.check, seq, self._vocab_size))

    def admit_ready(self, scheduler: Scheduler, busy: bool) -> list[RejectedSequence]:
        """Schedule the held sequences whose matcher is built; finish (abort) and return those whose
        grammar was refused. `busy`: the engine has other work this step (else wait a little)."""
        outcome = self.take_ready(0.0 if busy else IDLE_WAIT_S)
        for seq in outcome.ready:
            scheduler.add(seq)
        for rejected in outcome.rejected:
            scheduler.finish(rejected.seq, FinishReason.ABORT)
        return outcome.rejected

    def take_ready(self, wait_s: float = 0.0) -> GrammarOutcome:
        """The held sequences whose build finished; with `wait_s`, wait that long for one (an engine
        with nothing else to do would otherwise spin)."""
        outcome = GrammarOutcome()
        if not self._held:
            return outcome
        if wait_s > 0:
            pending = [f for _, f in self._held.values()]
            futures.wait(pending, timeout=wait_s, return_when=futures.FIRST_COMPLETED)
        for seq_id, (seq, build) in list(self._held.items()):
            if not build.done():
                continue
            del self._held[seq_id]
            error = build.exception()
            if error is None:
                outcome.ready.append(seq)
            else:
                reason = str(error) if isinstance(error, ValueError) else f"{type(error).__name__}: {error}"
                outcome.rejected.append(RejectedSequence(seq, reason))
        return outcome

    def abort(self, request_ids: Iterable[str], scheduler: Scheduler) -> list[Sequence]:
        """Stop holding these requests' sequences and finish them (aborted) in `scheduler`'s books (a
        build under way finishes and is dropped)."""
        wanted = set(request_ids)
        dropped = [seq for seq, _ in self._held.values() if seq.request_id in wanted]
        for seq in dropped:
            _, build = self._held.pop(seq.seq_id)
            build.cancel()
            scheduler.finish(seq, FinishReason.ABORT)
        return dropped

    def close(self) -> None:
        """Drop everything held and stop the threads (idempotent)."""
        self._held.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
