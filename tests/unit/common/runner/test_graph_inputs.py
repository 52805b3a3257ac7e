"""Decode-shaped steps as CUDA-graph rows (host side, runs on the CPU): a verification's or a draft
catch-up's rows carry exactly the positions, slots and context lengths of the varlen plan."""

from __future__ import annotations

import numpy as np
import torch

from common.core.sequence import Sequence
from common.runner.graph_inputs import (
    RowViews,
    fill_rows,
    packed_size,
    prepare_rows,
    query_lens,
    sampled_rows,
)
from common.runner.inputs import flat_sources, plan_step
from common.wire.sampling_params import SamplingParams

BLOCK = 4


def _seq(n_tokens: int, cached: int, drafts: list[int], first_block: int) -> Sequence:
    seq = Sequence(list(range(100, 100 + n_tokens)), SamplingParams(temperature=0), BLOCK)
    seq.add_drafts(drafts)
    seq.block_table = list(range(first_block, first_block + -(-len(seq) // BLOCK)))
    seq.set_cached_prefix(cached)
    seq.schedule(len(seq) - cached)
    return seq


def _views(rows: int, width: int) -> RowViews:
    return RowViews.over(np.zeros(packed_size(rows, width), dtype=np.int32), rows, width)


def test_rows_match_the_varlen_plan():
    # plain decode, a verification of 3 drafts across a block edge, a catch-up of 2 tokens
    seqs = [_seq(9, 8, [], 0), _seq(6, 5, [7, 8, 9], 10), _seq(13, 11, [], 20)]
    lens = query_lens(seqs, max_rows=16)
    assert lens == [1, 4, 2]
    v = _views(16, 8)
    fill_rows(v, seqs, lens, 8, None, BLOCK)
    plan = plan_step(seqs, BLOCK, is_decode=False)
    n = sum(lens)
    assert v.input_ids[:n].tolist() == plan.input_ids
    assert v.positions[:n].tolist() == plan.positions
    assert v.slots[:n].tolist() == plan.slots
    ends = [p + 1 for p in plan.positions]
    assert v.seq_lens[:n].tolist() == ends  # each row attends up to its own position
    assert (v.slots[n:8] == -1).all() and (v.seq_lens[n:8] == 1).all()  # padding writes nothing
    assert v.block_tables[1, :3].tolist() == seqs[1].block_table  # every row has its sequence's table
    # Sampled rows: the decode row, all 4 verification rows, the catch-up's last row (the plan's rule).
    assert sampled_rows(seqs, lens) == plan.sample_rows == [0, 1, 2, 3, 4, 6]
    counts, picked = prepare_rows(v, seqs, lens, 8, None, BLOCK)
    assert counts == plan.sample_counts == [1, 4, 1]
    assert v.picked[:picked].tolist() == plan.sample_rows  # what the step's logits are gathered by


def test_only_short_runs_that_end_at_the_last_token_are_graph_rows():
    prefill_chunk = _seq(40, 0, [], 0)
    prefill_chunk.schedule(16)  # does not reach the sequence's end
    assert query_lens([prefill_chunk], max_rows=64) is None
    assert query_lens([_seq(40, 0, [], 0)], max_rows=64) is None  # a prompt: the prefill kernel's job
    assert query_lens([_seq(9, 8, [], 0)] * 3, max_rows=2) is None  # more rows than captured
    assert sampled_rows([_seq(9, 8, [], 0), _seq(6, 5, [1, 2], 10)], [1, 3]) is None  # every row


def test_run_ahead_source_applies_to_the_last_row():
    seqs = [_seq(9, 8, [], 0), _seq(5, 3, [], 10)]
    v = _views(8, 4)
    fill_rows(v, seqs, [1, 2], 4, [5, 6], BLOCK)
    assert v.src_rows[:4].tolist() == [5, -1, 6, -1]
    assert torch.tensor(v.input_ids[:3]).min() >= 0


def test_run_ahead_source_applies_to_the_placeholder_before_its_drafts():
    """A verification launched behind a run-ahead step: the placeholder row reads the device token,
    the drafts after it their own ids; the eager step's per-token sources agree."""
    behind = _seq(6, 5, [], 10)
    behind.truncate(5)
    behind.append_placeholder()
    behind.add_drafts([7, 8])
    behind.schedule(3)
    seqs = [_seq(9, 8, [], 0), behind]
    v = _views(8, 4)
    fill_rows(v, seqs, [1, 3], 4, [5, 6], BLOCK)
    assert v.src_rows[:4].tolist() == [5, 6, -1, -1]
    assert v.input_ids[2:4].tolist() == [7, 8] and v.positions[1:4].tolist() == [5, 6, 7]
    assert flat_sources(seqs, [5, 6]) == [5, 6, -1, -1]


def test_table_rows_rewrite_exactly_what_changed():
    """Across steps the host view's rows always hold each sequence's current table, whether a row keeps
    its sequence (table grown in place), gets another one, or its sequence's table was replaced by a
    new list of the same length (preempted and readmitted into other blocks)."""
    a, b, c = _seq(9, 8, [], 0), _seq(5, 4, [], 10), _seq(13, 12, [], 20)
    v = _views(8, 8)

    def step(seqs):
        fill_rows(v, seqs, [1] * len(seqs), 4, None, BLOCK)
        for row, s in enumerate(seqs):
            assert v.block_tables[row, : len(s.block_table)].tolist() == s.block_table

    step([a, b, c])
    a.block_table.append(7)  # grown in place
    step([a, b, c])
    step([c, a])  # rows change owners
    b.block_table = [30, 31]  # same length as before, other blocks: a new list
    step([b, a, c])
    v.block_tables[:] = 0  # written by someone else (the graphs' cost measurement)
    v.tables.forget()
    step([b, a, c])
    assert v.tables.written[:3] == [2, 4, 4]
