"""One request's state inside an engine: tokens, block table and progress through the cache."""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable
from itertools import count
from typing import TYPE_CHECKING

from common.wire.blocks import blocks_for
from common.wire.hashing import extend_block_hashes, salt_root
from common.wire.logprobs import TokenLogprob
from common.wire.sampling_params import FinishReason, SamplingParams

if TYPE_CHECKING:
    import torch

# Host-side stand-in for a token sampled by a run-ahead step whose value is still on the device.
PLACEHOLDER = -1


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # queued for (re)computation of its uncached tokens
    RUNNING = "running"  # admitted: owns blocks, prefilling in chunks or decoding
    TRANSFERRING = "transferring"  # decode role: blocks allocated, KV arriving from a prefill worker
    HANDED_OFF = "handed_off"  # prefill role: first token sampled, blocks pinned for the transfer
    FINISHED = "finished"


_seq_ids = count()


class Sequence:
    """Token ids (prompt + generated), block table and how many tokens the cache already holds.

    Invariants: `num_cached_tokens + num_scheduled_tokens <= len(token_ids)`; the block table covers
    at least that many slots while running; `block_hashes[i]` is the chained hash of full block i of
    `token_ids` (computed lazily, only ever for tokens that exist); the last `num_draft_tokens`
    tokens are unverified speculative proposals and the `num_pending_tokens` before them run-ahead
    placeholders (drafts follow a placeholder when they were proposed one step behind, for a
    verification launched behind the step that samples the placeholder).

    Ownership: tokens and the cache counters change only through the verbs below (`schedule`,
    `commit_scheduled`, `append_token(s)`, `truncate`, `rollback_cache`, the placeholder and draft
    verbs), which keep those invariants. `block_table` and `num_registered_blocks` are written only
    by the BlockManager, `status`, `finish_reason` and the admission counters only by the Scheduler.
    A `block_table` list only grows in place (appends); any other change assigns a new list, so a
    reader that remembers the list object and its length knows which entries are unchanged (the
    CUDA-graph rows rewrite only new entries: `graph_inputs.TableRows`).
    """

    def __init__(
        self,
        token_ids: list[int],
        sampling_params: SamplingParams,
        block_size: int,
        request_id: str | None = None,
        num_prompt_tokens: int | None = None,
    ) -> None:
        self.seq_id = next(_seq_ids)
        self.request_id = request_id if request_id is not None else str(self.seq_id)
        self.token_ids = list(token_ids)
        self.num_prompt_tokens = len(self.token_ids) if num_prompt_tokens is None else num_prompt_tokens
        self.sampling_params = sampling_params
        self.sampling_key = sampling_params.batch_key()  # rows with one key sample alike (runner/inputs)
        # Read for every row at every step (run-ahead's drain check and launch): worked out once.
        self.reads_token_history = sampling_params.reads_token_history
        self.block_size = block_size
        self.status = SequenceStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.block_table: list[int] = []
        self.num_cached_tokens = 0
        self.num_scheduled_tokens = 0
        self.num_prefix_hit_tokens = 0  # cached tokens found at first admission (for usage reports)
        self.num_registered_blocks = 0  # leading blocks whose hashes the block manager has registered
        self.block_hashes: list[int] = []
        self.hash_root = salt_root(sampling_params.cache_salt)  # block 0's parent (its cache namespace)
        self.admit_order = -1
        # Monotonic times for the per-stage breakdown: made (request received), first admitted.
        self.created_at = time.monotonic()
        self.first_scheduled_at: float | None = None
        self.num_preemptions = 0
        self.num_pending_tokens = 0  # trailing placeholders whose values are still on the device
        self.num_draft_tokens = 0  # trailing speculative proposals being verified this step
        self.logprobs: list[TokenLogprob] = []
        # A seeded request's own random stream for its whole life (created by the runner on first use).
        self.generator: torch.Generator | None = None
        # A structured-output request's grammar matcher, host side (`common/runner/grammar.py`; created
        # by the runner on first use, advanced over `completion_token_ids` before each masked step).
        self.grammar_state: object | None = None

    def __len__(self) -> int:
        return len(self.token_ids)

    def __repr__(self) -> str:
        return (
            f"Sequence(id={self.seq_id}, req={self.request_id!r}, len={len(self)}, "
            f"cached={self.num_cached_tokens}, status={self.status.value})"
        )

    @property
    def num_completion_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def completion_token_ids(self) -> list[int]:
        """Generated tokens known on the host (a run-ahead step's placeholder and drafts excluded)."""
        return self.token_ids[self.num_prompt_tokens : self.num_known_tokens]

    @property
    def num_known_tokens(self) -> int:
        """Tokens whose values are settled on the host: all but the trailing placeholders and drafts."""
        return len(self.token_ids) - self.num_pending_tokens - self.num_draft_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def last_token(self) -> int:
        return self.token_ids[-1]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_cached_tokens

    @property
    def num_blocks_needed(self) -> int:
        return blocks_for(len(self.token_ids), self.block_size)

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def full_block_hashes(self, num_tokens: int | None = None) -> list[int]:
        """Hashes of the full blocks among the first `num_tokens` tokens (default: all)."""
        limit = len(self.token_ids) if num_tokens is None else num_tokens
        extend_block_hashes(self.block_hashes, self.token_ids, self.block_size, limit, self.hash_root)
        return self.block_hashes[: limit // self.block_size]

    # ---- verbs: the only writers of the token list and the cache counters -------------------------
    def schedule(self, num_tokens: int) -> None:
        """This step computes the next `num_tokens` uncached tokens."""
        room = len(self.token_ids) - self.num_cached_tokens
        if not 0 <= num_tokens <= room:
            raise ValueError(f"num_tokens must be in [0, {room}], got {num_tokens}")
        self.num_scheduled_tokens = num_tokens

    def commit_scheduled(self) -> None:
        """The scheduled tokens' KV is computed (or is being computed by a launched step)."""
        self.num_cached_tokens += self.num_scheduled_tokens
        self.num_scheduled_tokens = 0

    def set_cached_prefix(self, num_tokens: int) -> None:
        """The first `num_tokens` tokens' KV is already in the cache (a prefix hit at admission, or a
        finished KV transfer)."""
        if not 0 <= num_tokens <= len(self.token_ids):
            raise ValueError(f"num_tokens must be in [0, {len(self.token_ids)}], got {num_tokens}")
        self.num_cached_tokens = num_tokens
        self.num_scheduled_tokens = 0

    def rollback_cache(self, num_tokens: int) -> None:
        """Treat KV past the first `num_tokens` tokens as stale (rejected drafts, a diverged draft
        mirror): it is recomputed, overwriting it before it is read. Block hashes only ever cover
        cached tokens, so no block changes hands."""
        self.num_cached_tokens = min(self.num_cached_tokens, num_tokens)

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def append_tokens(self, token_ids: Iterable[int]) -> None:
        self.token_ids.extend(token_ids)

    def truncate(self, length: int) -> None:
        """Keep the first `length` tokens (a stop inside an accepted run, rejected drafts, an aborted
        run-ahead step's placeholder). The cache, the hashes and the trailing draft / placeholder
        counts shrink with them."""
        removed = len(self.token_ids) - length
        if removed <= 0:
            return
        del self.token_ids[length:]
        del self.block_hashes[length // self.block_size :]
        self.rollback_cache(length)
        self.num_scheduled_tokens = min(self.num_scheduled_tokens, length - self.num_cached_tokens)
        drafts_removed = min(removed, self.num_draft_tokens)  # the drafts come last
        self.num_draft_tokens -= drafts_removed
        self.num_pending_tokens = max(0, self.num_pending_tokens - (removed - drafts_removed))

    def append_placeholder(self) -> None:
        """Run-ahead: the next token is sampled on the device and known on the host only later."""
        self.token_ids.append(PLACEHOLDER)
        self.num_pending_tokens += 1

    def resolve_placeholder(self, token_id: int) -> int:
        """The oldest placeholder's value arrived; returns the token's position."""
        if self.num_pending_tokens == 0:
            raise ValueError(f"sequence {self.seq_id} has no pending placeholder")
        position = self.num_known_tokens
        self.token_ids[position] = token_id
        self.num_pending_tokens -= 1
        return position

    def add_drafts(self, drafts: list[int]) -> None:
        """Speculative proposals, verified by the next forward pass."""
        self.token_ids.extend(drafts)
        self.num_draft_tokens = len(drafts)

    def drop_drafts(self) -> None:
        """Forget unverified proposals (the sequence is being preempted)."""
        self.truncate(len(self.token_ids) - self.num_draft_tokens)

    def keep_drafts(self, num_accepted: int) -> None:
        """After verification: the first `num_accepted` drafts become real tokens (their KV, computed
        by the verifying pass, is valid); the rest are dropped with their KV."""
        base = len(self.token_ids) - self.num_draft_tokens
        self.commit_scheduled()
        self.truncate(base + num_accepted)
        self.num_draft_tokens = 0

    def reset_for_recompute(self) -> None:
        """Forget cache placement (after preemption or a failed transfer); tokens are kept."""
        self.block_table = []
        self.num_cached_tokens = 0
        self.num_scheduled_tokens = 0
        self.num_registered_blocks = 0
        self.status = SequenceStatus.WAITING
