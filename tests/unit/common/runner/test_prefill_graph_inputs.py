"""Prefill and mixed steps as packed CUDA-graph inputs (host side, runs on the CPU): every field of a
filled step equals the eager plan's (`plan_step`), and the padding writes nothing and owns nothing."""

from __future__ import annotations

import numpy as np
import pytest

from common.core.sequence import Sequence
from common.runner.inputs import flat_sources, plan_step
from common.runner.prefill_graph_inputs import StepLayout, fill_step, prefill_capture_sizes, step_token_reach
from common.wire.sampling_params import SamplingParams

BLOCK = 4


def _seq(n_tokens: int, cached: int, scheduled: int, first_block: int, drafts=()) -> Sequence:
    seq = Sequence(list(range(100 + first_block, 100 + first_block + n_tokens)), SamplingParams(), BLOCK)
    seq.add_drafts(list(drafts))
    seq.block_table = list(range(first_block, first_block + -(-len(seq) // BLOCK)))
    seq.set_cached_prefix(cached)
    seq.schedule(scheduled)
    return seq


def _mixed_step() -> list[Sequence]:
    return [
        _seq(9, 8, 1, 0),  # decoding
        _seq(30, 0, 30, 10),  # a whole prompt
        _seq(40, 12, 16, 20),  # a chunk after a cached prefix, stopping short of the end
        _seq(6, 5, 4, 40, drafts=[7, 8, 9]),  # a verification of 3 drafts
        _seq(21, 16, 5, 50),  # the last chunk of a prompt
    ]


def _filled(seqs, bucket=64, src_rows=None, layout=StepLayout(64, 8, 16)):
    v = layout.views(np.zeros(layout.size, dtype=np.int32))
    return v, fill_step(v, seqs, bucket, src_rows, BLOCK)


def test_fields_match_the_eager_plan():
    seqs = _mixed_step()
    v, step = _filled(seqs)
    plan = plan_step(seqs, BLOCK, is_decode=False)
    n, t = len(seqs), step.num_tokens
    assert t == len(plan.input_ids) == 56
    assert v.input_ids[:t].tolist() == plan.input_ids
    assert v.positions[:t].tolist() == plan.positions
    assert v.slots[:t].tolist() == plan.slots
    assert v.query_start_loc[: n + 1].tolist() == plan.starts
    assert v.seq_lens[:n].tolist() == plan.seq_lens
    assert step.sample_counts == plan.sample_counts == [1, 1, 0, 4, 1]
    assert v.picked[: step.num_picked].tolist() == plan.sample_rows
    for row, seq in enumerate(seqs):
        assert v.block_tables[row, : len(seq.block_table)].tolist() == seq.block_table


def test_padding_writes_nothing_and_owns_nothing():
    seqs = _mixed_step()
    v, step = _filled(seqs)
    t, n = step.num_tokens, len(seqs)
    assert (v.slots[t:64] == -1).all()  # padding tokens never write KV
    assert (v.input_ids[t:64] == 0).all() and (v.positions[t:64] == 0).all()
    assert (v.query_start_loc[n + 1 :] == t).all()  # padding sequences have no queries...
    assert (v.seq_lens[n:] == 0).all()  # ...and no context
    assert (v.src_rows[:64] == -1).all()


def test_a_smaller_step_after_a_larger_one_leaves_no_stale_values():
    layout = StepLayout(64, 8, 16)
    v = layout.views(np.zeros(layout.size, dtype=np.int32))
    fill_step(v, _mixed_step(), 64, [3, -1, -1, 2, -1], BLOCK)
    seqs = [_seq(9, 8, 1, 60), _seq(5, 0, 5, 70)]
    step = fill_step(v, seqs, 16, None, BLOCK)
    plan = plan_step(seqs, BLOCK, is_decode=False)
    assert v.slots[: step.num_tokens].tolist() == plan.slots
    assert (v.slots[step.num_tokens : 16] == -1).all()
    assert (v.src_rows[:16] == -1).all()
    assert (v.seq_lens[2:] == 0).all() and (v.query_start_loc[3:] == 6).all()
    assert v.block_tables[0, :3].tolist() == seqs[0].block_table


def test_run_ahead_sources_match_the_eager_step():
    seqs = _mixed_step()
    seqs[0].token_ids[-1] = -1  # a placeholder: its value comes from the previous step's row 3
    src_rows = [3, -1, -1, 2, -1]
    v, step = _filled(seqs, src_rows=src_rows)
    assert v.src_rows[: step.num_tokens].tolist() == flat_sources(seqs, src_rows)
    assert v.input_ids[0] == 0  # placeholders are clamped to a valid id until the source replaces them


def test_a_step_larger_than_its_bucket_is_refused():
    with pytest.raises(ValueError, match="bucket"):
        _filled(_mixed_step(), bucket=32)


def test_layout_reads_a_prefix_through_the_last_table_row():
    layout = StepLayout(max_tokens=64, max_seqs=8, width=16)
    assert layout.used(8) == layout.size
    assert layout.size - layout.used(5) == 3 * 16
    with pytest.raises(ValueError, match="max_seqs"):
        StepLayout(64, 0, 16)


def test_capture_sizes_bound_the_padding():
    assert prefill_capture_sizes(8192)[:8] == [16, 32, 64, 128, 256, 512, 1024, 1536]
    sizes = prefill_capture_sizes(16384)
    assert sizes[-1] == 16384 and sorted(sizes) == sizes
    for small, large in zip(sizes, sizes[1:], strict=False):
        if small >= 1024:
            assert large - small <= max(512, small // 4)
    assert prefill_capture_sizes(100) == [16, 32, 64, 100]
    with pytest.raises(ValueError, match="max_tokens"):
        prefill_capture_sizes(0)


def test_step_token_reach_is_what_the_sequence_limit_can_fill():
    # One sequence of at most 4,096 tokens never fills a 16,384-token budget: the buckets stop there
    # (floors.py --batches 1 failed at capture before this bound).
    assert step_token_reach(16384, 1, 4096) == 4096
    assert step_token_reach(16384, 8, 4096) == 16384
    assert step_token_reach(512, 64, 4096) == 512
    with pytest.raises(ValueError, match="max_seq_len"):
        step_token_reach(512, 1, 0)
