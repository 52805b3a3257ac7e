"""Speculative proposals from a smaller draft model with the same vocabulary.

The draft model runs through the engine's own machinery (a `ModelRunner` with its own paged KV cache,
`BlockManager` and, on a GPU, CUDA graphs). Each target sequence being speculated has a mirror
sequence on the draft side. A proposal first brings the mirror's KV up to the target's tokens
(rolling back past any rejected drafts: only `num_cached_tokens` moves, as on the target), then
decodes `room` tokens greedily, for all sequences of the step together.
Greedy drafts are a point mass, so the target's verification stays exact (see
`common.spec_decode.speculative`).
"""

from __future__ import annotations

import torch

from common.config import EngineConfig
from common.core.block_manager import BlockManager
from common.core.sequence import Sequence
from common.model_config import ModelConfig
from common.runner.model_runner import ModelRunner
from common.spec_decode.speculative import Proposer
from common.wire.sampling_params import SamplingParams

_GREEDY = SamplingParams(temperature=0.0, max_tokens=1 << 30, ignore_eos=True)


class DraftModelProposer(Proposer):
    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.max_len = runner.max_model_len  # the draft model's context bounds what it can draft for
        self.blocks = BlockManager(
            runner.num_kv_blocks, runner.block_size, enable_prefix_caching=False, record_events=False
        )
        self.mirrors: dict[int, Sequence] = {}

    def draft_batch(self, seqs: list[Sequence], rooms: list[int]) -> list[list[int]]:
        """Greedy drafts for every sequence at once: one catch-up step (each mirror computes the
        tokens it lacks and samples its first draft), then one-token steps while any mirror has room
        left. The draft runner replays its CUDA graphs for these steps where it has them; each step
        takes its input tokens from the previous step's samples on the device, and the drafts come
        back to the host in one copy at the end."""
        mirrors: list[Sequence] = []
        wanted: list[int] = []
        for seq, room in zip(seqs, rooms, strict=True):
            mirror = self._sync(seq)
            if not self.blocks.grow(mirror, len(mirror) + room):
                self.release(seq)  # the draft cache is full: no proposal this time
                room = 0
            mirrors.append(mirror)
            wanted.append(room)
        active = [i for i, room in enumerate(wanted) if room > 0]
        for i in active:
            mirrors[i].schedule(mirrors[i].num_uncomputed_tokens)
        steps: list[list[int]] = []  # per step: the mirrors it advanced, in row order
        outputs: list[torch.Tensor] = []
        while active:
            rows = None
            if steps:  # a one-token step: the input is the mirror's previous sample (still on device)
                previous = {i: row for row, i in enumerate(steps[-1])}
                rows = [previous[i] for i in active]
                for i in active:
                    mirrors[i].commit_scheduled()
                    mirrors[i].append_placeholder()
                    mirrors[i].schedule(1)
            outputs.append(self.runner.launch_on_device([mirrors[i] for i in active], rows))
            steps.append(active)
            active = [i for i in active if wanted[i] > len(steps)]
        return self._collect(mirrors, steps, outputs, len(seqs))

    @staticmethod
    def _collect(
        mirrors: list[Sequence], steps: list[list[int]], outputs: list[torch.Tensor], n: int
    ) -> list[list[int]]:
        """Read every step's samples back at once and put them in place: each mirror keeps its
        drafts (the next sync keeps the KV of those the target accepts); the last is uncomputed."""
        drafts: list[list[int]] = [[] for _ in range(n)]
        if not outputs:
            return drafts
        flat = torch.cat(outputs).tolist()  # the one host sync
        for active, width in zip(steps, (len(a) for a in steps), strict=True):
            for i, token in zip(active, flat[:width], strict=True):
                drafts[i].append(token)
            flat = flat[width:]
        for i, tokens in enumerate(drafts):
            if tokens:
                mirror = mirrors[i]
                mirror.commit_scheduled()
                for token in tokens[:-1]:
                    mirror.resolve_placeholder(token)
                mirror.append_token(tokens[-1])
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


def build_draft_proposer(
    config: EngineConfig, model_config: ModelConfig, runner: ModelRunner, max_model_len: int
) -> Proposer:
    """Load the draft model beside the target: same device, dtype and block size, as many KV blocks
    as the target, and (unless the target runs eager) its own CUDA graphs for its one-token steps."""
    draft_config = ModelConfig.from_dir(config.draft_model)
    if draft_config.vocab_size != model_config.vocab_size:
        raise ValueError(
            f"draft_model: vocabulary of {draft_config.vocab_size} tokens differs from the target's "
            f"{model_config.vocab_size}"
        )
    limit = min(max_model_len, draft_config.max_position_embeddings)
    engine = EngineConfig(
        model=config.draft_model,
        device=config.device,
        dtype=config.dtype,
        enforce_eager=config.enforce_eager,
        max_num_seqs=config.max_num_seqs,
        kvcache_block_size=config.kvcache_block_size,
        num_kvcache_blocks=runner.num_kv_blocks,
        max_model_len=limit,
        attention_backend=config.attention_backend,
        seed=config.seed,
    )
    draft_runner = ModelRunner.load(engine, draft_config, runner.platform, limit)
    return DraftModelProposer(draft_runner)
