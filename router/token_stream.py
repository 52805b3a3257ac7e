"""One sequence's token stream: put worker messages in completion order and turn them into text.

The prefill worker sends the token at index 0 and the decode worker indices 1..; the two travel on
different paths, so the decode stream may arrive first. `TokenReorderBuffer` holds messages until
every earlier position has arrived. `SequenceOutput` then applies them: it counts tokens, enforces
max_tokens, detokenizes (stop strings included) and decides when the sequence is finished.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from common.wire.detokenizer import IncrementalDetokenizer
from common.wire.logprobs import TokenLogprob
from common.wire.messages import TokenOutput
from common.wire.sampling_params import FinishReason, SamplingParams


class TokenReorderBuffer:
    """Releases TokenOutputs in index order; a message with finish_reason closes the stream.

    Invariant: `next_index` is the completion position of the first token not yet released. Messages
    for positions already released (duplicates, retries) are dropped.
    """

    def __init__(self) -> None:
        self.next_index = 0
        self.closed = False
        self._pending: dict[int, TokenOutput] = {}

    def push(self, msg: TokenOutput) -> list[TokenOutput]:
        if self.closed or msg.index < self.next_index:
            return []
        existing = self._pending.get(msg.index)
        if existing is None or (not existing.token_ids and msg.token_ids):
            self._pending[msg.index] = msg
        ready = []
        while not self.closed and self.next_index in self._pending:
            out = self._pending.pop(self.next_index)
            ready.append(out)
            self.next_index += len(out.token_ids)
            self.closed = out.finish_reason is not None
        return ready

    @property
    def num_buffered(self) -> int:
        return len(self._pending)


@dataclass
class SequenceUpdate:
    """What one applied message changed: new visible text and tokens, and whether it ended."""

    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None
    finish_reason: FinishReason | None = None
    finished_by_worker: bool = False  # the worker ended it itself (no Abort needed)

    def can_merge(self, later: SequenceUpdate) -> bool:
        return self.finish_reason is None and (self.logprobs is None) == (later.logprobs is None)

    def merged(self, later: SequenceUpdate) -> SequenceUpdate:
        """This update followed by `later`, as one (one SSE chunk for a stream that fell behind)."""
        logprobs = None if self.logprobs is None else self.logprobs + (later.logprobs or [])
        return SequenceUpdate(
            self.text + later.text,
            self.token_ids + later.token_ids,
            logprobs,
            later.finish_reason,
            later.finished_by_worker,
        )


class StreamInterval:
    """Holds each choice's updates until `k` tokens are pending, so a stream sends one chunk per `k`
    tokens (vLLM's --stream-interval). A choice's first tokens and its finish go out at once: TTFT and
    the end of the stream are unchanged. k == 1 passes every update through."""

    def __init__(self, k: int) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"stream_interval must be a positive int, got {k!r}")
        self.k = k
        self._held: dict[int, SequenceUpdate] = {}
        self._started: set[int] = set()

    def push(self, choice: int, update: SequenceUpdate) -> SequenceUpdate | None:
        """The update to send now (merged with what was held), or None: held back."""
        if self.k == 1:
            return update
        held = self._held.pop(choice, None)
        if held is not None:
            update = held.merged(update)  # a held update never finished, so it merges
        if choice in self._started and update.finish_reason is None and len(update.token_ids) < self.k:
            self._held[choice] = update
            return None
        if update.token_ids or update.text:
            self._started.add(choice)
        return update


class SequenceOutput:
    """Accumulated output of one sequence, fed with in-order TokenOutputs."""

    def __init__(self, detokenizer: IncrementalDetokenizer, sampling: SamplingParams) -> None:
        self._detok = detokenizer
        self._sampling = sampling
        self.num_prompt_tokens = 0
        self.cached_tokens = 0
        self.token_ids: list[int] = []
        self.kv_transfer_bytes = 0
        self.kv_transfer_seconds = 0.0
        self.finish_reason: FinishReason | None = None
        self.timings: dict[str, float] = {}  # stage -> seconds, as the workers reported them
        # Router clock, set by the lifecycle: first dispatch, token at index 0, first decode token.
        self.dispatched_at: float | None = None
        self.first_token_at: float | None = None
        self.first_decode_at: float | None = None
        self.last_token_at: float | None = None  # when its latest tokens were passed on (inter-token gaps)

    @property
    def num_generated(self) -> int:
        return len(self.token_ids)

    @property
    def text(self) -> str:
        return self._detok.text

    @property
    def takes_joined(self) -> bool:
        """Whether applying consecutive messages joined (`joined`) gives what applying them one by one
        does: not while a stop string may end the text inside them (the tokens past it would count)
        or while min_tokens decides, per message, whether stop strings count."""
        return not self._detok.has_stop_strings and self.num_generated >= self._sampling.min_tokens

    def apply_run(self, run: list[TokenOutput]) -> SequenceUpdate:
        """Apply consecutive in-order messages as one: a run of `joined` (or a single message)."""
        if self.finish_reason is not None:
            return SequenceUpdate("", [], None, self.finish_reason)
        out = run[0]  # only a run's first message carries more than tokens (`joined`)
        if out.index == 0:
            self.num_prompt_tokens, self.cached_tokens = out.num_prompt_tokens, out.cached_tokens
        if out.timings:  # each worker reports once; a retry's repeat is ignored
            for stage, seconds in out.timings.items():
                self.timings.setdefault(stage, seconds)
        self.kv_transfer_bytes += out.kv_transfer_bytes
        self.kv_transfer_seconds += out.kv_transfer_seconds
        if len(run) == 1:
            return self._extend(out.token_ids, out.logprobs, out.finish_reason)
        logprobs = None if out.logprobs is None else [lp for m in run for lp in m.logprobs or ()]
        return self._extend([t for m in run for t in m.token_ids], logprobs, run[-1].finish_reason)

    def _extend(
        self, token_ids: list[int], all_logprobs: list[TokenLogprob] | None, finish: FinishReason | None
    ) -> SequenceUpdate:
        room = self._sampling.max_tokens - self.num_generated
        tokens = token_ids[:room]
        logprobs = all_logprobs[: len(tokens)] if all_logprobs is not None else None
        self.token_ids.extend(tokens)
        worker_finish = finish
        if len(token_ids) > room or (finish is None and self.num_generated >= self._sampling.max_tokens):
            finish = FinishReason.LENGTH  # the router enforces max_tokens even if a worker overshoots
        text_tokens = self._sampling.visible_tokens(tokens, finish)
        delta = self._detok.add(text_tokens, check_stop=self.num_generated >= self._sampling.min_tokens)
        text = delta.text
        if delta.stop is not None:
            finish = FinishReason.STOP
        elif finish is not None:
            text += self._detok.finish().text
        self.finish_reason = finish
        by_worker = finish is not None and finish == worker_finish and delta.stop is None
        return SequenceUpdate(text, tokens, logprobs, finish, by_worker)


def joined(outs: list[TokenOutput]) -> list[list[TokenOutput]]:
    """Consecutive in-order messages in runs, each applied as one (`SequenceOutput.apply_run`: one
    detokenizer pass for what a reader took at once, e.g. a stream gathering --stream-interval tokens).
    A message joins the one before it only if it carries nothing but tokens, and neither is the first
    token (index 0 carries the prompt's counts and marks the first token's time)."""
    runs: list[list[TokenOutput]] = []
    for out in outs:
        if runs and _joins(runs[-1][-1], out):
            runs[-1].append(out)
        else:
            runs.append([out])
    return runs


def _joins(before: TokenOutput, out: TokenOutput) -> bool:
    return (
        before.index != 0
        and out.index != 0
        and before.finish_reason is None
        and not out.timings
        and not out.kv_transfer_bytes
        and not out.kv_transfer_seconds
        and (before.logprobs is None) == (out.logprobs is None)
    )


class ReplayMismatch(Exception):
    """A retry produced tokens other than those the failed attempt already gave the client."""


def trim_replayed(out: TokenOutput, seen: list[int]) -> TokenOutput | None:
    """The part of `out` past the first `len(seen)` tokens, which a failed attempt already produced.

    A deterministic request retried after a worker died regenerates the same tokens; those the client
    already has are checked and dropped, so the client's stream just continues. None: nothing new yet.
    Raises ReplayMismatch if the retry diverged (or finished) within the tokens already seen.
    """
    if out.index >= len(seen):
        return out
    end = out.index + len(out.token_ids)
    overlap = out.token_ids[: max(0, min(end, len(seen)) - out.index)]
    if overlap != seen[out.index : out.index + len(overlap)]:
        raise ReplayMismatch(f"token at index {out.index} differs from the failed attempt's")
    if end < len(seen):
        if out.finish_reason is not None:
            raise ReplayMismatch(f"retry finished at index {end}, before the {len(seen)} tokens already sent")
        return None
    rest = out.token_ids[len(overlap) :]
    if not rest and out.finish_reason is None:
        return None
    logprobs = out.logprobs[len(overlap) :] if out.logprobs is not None else None
    return replace(out, index=len(seen), token_ids=rest, logprobs=logprobs, cached_tokens=0)
