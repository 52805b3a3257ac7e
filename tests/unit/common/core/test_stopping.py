"""Where a run of new tokens stops: `first_stop` answers as `stop_reason` token by token does."""

from __future__ import annotations

import random

from common.core.sequence import Sequence
from common.core.stopping import first_stop, stop_reason
from common.wire.sampling_params import SamplingParams


def _token_by_token(seq, tokens, length, eos, max_len):
    for i, token in enumerate(tokens):
        reason = stop_reason(seq, token, length + i + 1, eos, max_len)
        if reason is not None:
            return i, reason
    return None


def test_a_run_stops_where_its_first_stopping_token_is():
    rng = random.Random(0)
    stops = found = 0
    for _ in range(2000):
        params = SamplingParams(
            temperature=0,
            max_tokens=rng.randint(3, 12),
            min_tokens=rng.choice([0, 0, 3]),
            stop_token_ids=rng.choice([[], [5], [5, 7]]),
            ignore_eos=rng.random() < 0.3,
        )
        prompt = [1] * rng.randint(1, 6)
        seq = Sequence(prompt + [9] * rng.randint(0, 4), params, 16, num_prompt_tokens=len(prompt))
        tokens = [rng.randrange(10) for _ in range(rng.randint(1, 6))]
        max_len = rng.choice([64, len(seq) + 2])
        want = _token_by_token(seq, tokens, len(seq), (2,), max_len)
        assert first_stop(seq, tokens, len(seq), (2,), max_len) == want
        stops += want is not None
        found += want is not None and want[0] > 0
    assert stops > 200 and found > 50  # stops of every kind, and inside runs, were compared
