"""Speculative proposals from a smaller draft model with the same vocabulary.

The draft model runs through the engine's own machinery (a `ModelRunner` with its own paged KV cache
and `BlockManager`). Each target sequence being speculated has a mirror sequence on the draft side.
A proposal first brings the mirror's KV up to the target's tokens (rolling back past any rejected
drafts: only `num_cached_tokens` moves, as on the target), then decodes `room` tokens greedily.
Greedy drafts are a point mass, so the target's verification stays exact (see `common.speculative`).
"""

from __future__ import annotations

from common.block_manager import BlockManager
from common.runner.model_runner import ModelRunner
from common.sampling_params import SamplingParams
from common.sequence import Sequence
from common.speculative import Proposer, SpeculativeConfig

_GREEDY = SamplingParams(temperature=0.0, max_tokens=1 << 30, ignore_eos=True)


class DraftModelProposer(Proposer):
    def __init__(self, config: SpeculativeConfig, max_model_len: int, runner: ModelRunner) -> None:
        super().__init__(config, max_model_len)
        self.runner = runner
        self.blocks = BlockManager(runner.num_kv_blocks, runner.block_size, enable_prefix_caching=False)
        self.mirrors: dict[int, Sequence] = {}

    def draft(self, seq: Sequence, room: int) -> list[int]:
        mirror = self._sync(seq)
        if not self.blocks.grow(mirror, len(mirror) + room):
            self.release(seq)  # the draft cache is full: no proposal this time
            return []
        drafts: list[int] = []
        for _ in range(room):
            mirror.schedule(mirror.num_uncomputed_tokens)
            token = self.runner.run([mirror], is_decode=False).sampled[0][0]
            mirror.commit_scheduled()
            mirror.append_token(token)
            drafts.append(token)
        # The drafts stay in the mirror: the next sync keeps the KV of those the target accepts.
        return drafts

    def release(self, seq: Sequence) -> None:
        mirror = self.mirrors.pop(seq.seq_id, None)
        if mirror is not None:
            self.blocks.free(mirror)

    def _sync(self, seq: Sequence) -> Sequence:
        """The mirror holding `seq`'s real tokens, with KV kept only for the prefix they share."""
        mirror = self.mirrors.get(seq.seq_id)
        if mirror is None:
            mirror = Sequence(
                [], _GREEDY, self.runner.block_size, request_id=seq.request_id, num_prompt_tokens=0
            )
            self.mirrors[seq.seq_id] = mirror
        same = _common_prefix(mirror.token_ids, seq.token_ids)
        mirror.truncate(same)
        mirror.append_tokens(seq.token_ids[same:])
        mirror.rollback_cache(len(mirror) - 1)  # the proposal's first pass computes at least one token
        return mirror


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
