"""What a prefill graph computes, checked on the CPU: every prefill and mixed step of an engine run goes
through `fill_step` + `packed_forward` (the function the graphs capture), padded to its bucket, and
the greedy tokens equal the eager engine's, with chunked prompts, prefix hits, and mixed steps
launched behind run-ahead decode steps (their placeholders read the previous step's tokens)."""

from __future__ import annotations

import random

import numpy as np
import torch

from common import LLM, SamplingParams
from common.runner.prefill_graph_inputs import StepLayout, fill_step, prefill_capture_sizes
from common.runner.prefill_graphs import packed_forward
from common.wire.blocks import blocks_for
from tests.helpers.staggered import run_staggered

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
BUDGET, MAX_SEQS, MAX_LEN = 64, 16, 512


def _prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(500) for _ in range(60)]
    fresh = [[rng.randrange(500) for _ in range(rng.randint(3, 200))] for _ in range(8)]
    return fresh + [shared + [rng.randrange(500) for _ in range(n)] for n in (3, 20, 50)] + [shared]


def _llm(model: str) -> LLM:
    return LLM(
        model,
        dtype="float32",
        max_model_len=MAX_LEN,
        max_num_seqs=MAX_SEQS,
        max_num_batched_tokens=BUDGET,
        num_kvcache_blocks=200,
        async_scheduling=True,  # run-ahead decode steps on the CPU too
    )


def _outputs(llm: LLM):
    rounds = [o["token_ids"] for _ in range(2) for o in llm.generate(_prompts(0), GREEDY, use_tqdm=False)]
    return rounds, run_staggered(llm.engine, _prompts(1) + _prompts(0), GREEDY)


class PackedSteps:
    """Routes a runner's prefill and mixed steps through one packed buffer, as the graphs do."""

    def __init__(self, runner) -> None:
        self.runner, self.eager = runner, runner.forward_logits
        self.layout = StepLayout(BUDGET, MAX_SEQS, blocks_for(MAX_LEN, runner.block_size))
        self.packed = torch.zeros(self.layout.size, dtype=torch.int32)
        self.host = self.layout.views(self.packed.numpy())  # the same memory: no copy on the CPU
        self.dev = self.layout.views(self.packed)
        self.prev_tokens = torch.zeros(MAX_SEQS, dtype=torch.int32)
        self.steps: list[tuple[int, int, bool]] = []  # (tokens, bucket, behind a run-ahead step)
        runner.forward_logits = self.forward_logits

    def forward_logits(self, seqs, is_decode, src_rows=None):
        if is_decode:
            return self.eager(seqs, is_decode, src_rows)
        tokens = sum(s.num_scheduled_tokens for s in seqs)
        bucket = next(b for b in prefill_capture_sizes(BUDGET) if b >= tokens)
        if src_rows is not None:
            prev = self.runner._prev_tokens
            self.prev_tokens[: prev.shape[0]] = prev
        step = fill_step(self.host, seqs, bucket, src_rows, self.runner.block_size)
        self.steps.append((tokens, bucket, src_rows is not None))
        runner = self.runner
        with torch.inference_mode():
            hidden = packed_forward(runner.model, runner.backend, self.dev, bucket, self.prev_tokens, MAX_LEN)
            if not step.num_picked:
                return None, step.sample_counts
            rows = hidden.index_select(0, self.dev.picked[: step.num_picked])
            return runner.model.compute_logits(rows), step.sample_counts


def test_packed_steps_give_the_eager_tokens(tiny_model_dirs):
    model = tiny_model_dirs["qwen3"]
    want = _outputs(_llm(model))
    llm = _llm(model)
    packed = PackedSteps(llm.engine.runner)
    got = _outputs(llm)
    assert got == want
    steps = np.array(packed.steps)
    assert (steps[:, 0] < steps[:, 1]).any()  # padded steps
    assert (steps[:, 0] == BUDGET).any()  # full chunks
    assert steps[:, 2].any()  # mixed steps behind run-ahead decode steps
    assert llm.engine.block_manager.stats.hit_tokens > 0
