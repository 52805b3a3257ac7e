"""The vocabulary rule for token ids a client sends (a prompt, stop_token_ids, logit_bias's keys): each
must index the model's logits. One rule for the router (against its tokenizer's vocabulary, a 400 naming
the field) and the engine (against the model's, a ValueError failing that request alone: an id outside
the logits would fail the whole batch's step). Torch-free."""

from __future__ import annotations

from collections.abc import Sequence

from common.wire.wire_fields import only_type


def check_token_ids(name: str, ids: Sequence[int], vocab_size: int) -> None:
    """Every id an int in [0, vocab_size); else ValueError "<name> token id X is outside ...", naming
    the first bad one. The common case runs in C (prompts are hundreds of ids)."""
    if only_type(ids, int) and (not ids or (min(ids) >= 0 and max(ids) < vocab_size)):
        return
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size:
            raise ValueError(f"{name} token id {t!r} is outside the vocabulary [0, {vocab_size})")
