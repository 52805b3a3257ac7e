"""Lists of strs and of int lists (a TokenBatch's columns) are checked in one pass; anything that fails it
still gets the per-element error naming the element, and the message keeps its own copy of the list."""

from __future__ import annotations

import pytest

from common.wire.messages import MessageError, TokenBatch


def batch(request_ids: list, token_ids: list) -> TokenBatch:
    n = len(request_ids)
    return TokenBatch("w0", request_ids, [0] * n, token_ids, [1] * n)


@pytest.mark.parametrize(
    ("request_ids", "token_ids", "error"),
    [
        (["a", "b", "c"], [[1], [2], ["x"]], "token_ids[2] must be a list of ints"),
        (["a", "b"], [[1], 7], "token_ids[1] must be a list of ints"),
        (["a", "b"], [[1], (2,)], "token_ids[1] must be a list of ints"),
        (["a", "b"], [[1], [2**70]], "token_ids[1] holds an int msgpack cannot carry"),
        (["a", "b"], [[1], [True]], "token_ids[1] must be a list of ints"),
        (["a", 3], [[1], [2]], "request_ids[1] must be a str, got int"),
    ],
)
def test_a_bad_element_is_named(request_ids, token_ids, error) -> None:
    with pytest.raises(MessageError, match=error.replace("[", r"\[").replace("]", r"\]")):
        batch(request_ids, token_ids)


def test_valid_columns_are_copied_not_aliased() -> None:
    ids, rows = ["a", "b"], [[1, 2], [3]]
    msg = batch(ids, rows)
    assert (msg.request_ids, msg.token_ids) == (ids, rows)
    assert msg.request_ids is not ids and msg.token_ids is not rows
    ids.append("c")
    assert msg.request_ids == ["a", "b"]
