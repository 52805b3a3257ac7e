"""One request's state inside an engine: tokens, block table and progress through the cache."""

from __future__ import annotations

import enum
from itertools import count

from common.hashing import extend_block_hashes
from common.logprobs import TokenLogprob
from common.sampling_params import FinishReason, SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # queued for (re)computation of its uncached tokens
    RUNNING = "running"  # admitted: owns blocks, prefilling in chunks or decoding
    TRANSFERRING = "transferring"  # decode role: blocks allocated, KV arriving from a prefill worker
    HANDED_OFF = "handed_off"  # prefill role: first token sampled, blocks pinned for the transfer
    FINISHED = "finished"


_seq_ids = count()


class Sequence:
    """Token ids (prompt + generated), block table and how many tokens the cache already holds.

    Invariants: `num_cached_tokens <= len(token_ids)`; the block table covers at least
    `num_cached_tokens + num_scheduled_tokens` slots while running; `block_hashes[i]` is the chained
    hash of full block i of `token_ids` (computed lazily, only ever for tokens that exist).
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
        self.block_size = block_size
        self.status = SequenceStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.block_table: list[int] = []
        self.num_cached_tokens = 0
        self.num_scheduled_tokens = 0
        self.num_prefix_hit_tokens = 0  # cached tokens found at first admission (for usage reports)
        self.num_registered_blocks = 0  # leading blocks whose hashes the block manager has registered
        self.block_hashes: list[int] = []
        self.admit_order = -1
        self.num_preemptions = 0
        self.num_pending_tokens = 0  # trailing placeholders whose values are still on the device
        self.num_draft_tokens = 0  # trailing speculative proposals being verified this step
        self.spec_backoff = 0  # speculative decoding: current back-off after rejected proposals
        self.spec_skip_steps = 0  # decode steps left before proposing again
        self.logprobs: list[TokenLogprob] = []

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
        """Generated tokens known on the host (a run-ahead step's placeholder is excluded)."""
        return self.token_ids[self.num_prompt_tokens : len(self.token_ids) - self.num_pending_tokens]

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
        return (len(self.token_ids) + self.block_size - 1) // self.block_size

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def full_block_hashes(self, num_tokens: int | None = None) -> list[int]:
        """Hashes of the full blocks among the first `num_tokens` tokens (default: all)."""
        limit = len(self.token_ids) if num_tokens is None else num_tokens
        extend_block_hashes(self.block_hashes, self.token_ids[:limit], self.block_size)
        return self.block_hashes[: limit // self.block_size]

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def reset_for_recompute(self) -> None:
        """Forget cache placement (after preemption or a failed transfer); tokens are kept."""
        self.block_table = []
        self.num_cached_tokens = 0
        self.num_scheduled_tokens = 0
        self.num_registered_blocks = 0
        self.status = SequenceStatus.WAITING
