"""Incremental detokenization on SmolLM2's byte-level BPE: split characters and stop strings, by
window decoding and by the byte table alike (each test runs on both)."""

from __future__ import annotations

import functools
import random

import pytest

from common.tools.default_model import prepare_default_model
from common.wire.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer
from router.tokenizer import ModelTokenizer


@pytest.fixture(scope="module")
def tokenizer() -> ModelTokenizer:
    return ModelTokenizer.from_dir(prepare_default_model(progress=False))


@pytest.fixture(scope="module", params=["window", "bytes"])
def make(request, tokenizer: ModelTokenizer):
    """Builds detokenizers decoding by windows through the tokenizer, or by its byte table."""
    table = tokenizer.byte_table if request.param == "bytes" else None
    assert (table is None) == (request.param == "window")
    return functools.partial(IncrementalDetokenizer, tokenizer.backend, byte_table=table)


TEXTS = [
    "Hello 😀 world",
    "世界你好，今天天气很好。",
    "emoji 👨‍👩‍👧‍👦 family and flags 🇫🇷🇯🇵",
    "mixed: naïve café — “quotes” ½ ∑ 𝄞",
    "  leading spaces\n\nand\ttabs  ",
]


def _stream(make, ids: list[int], stop=(), step: int = 1) -> tuple[list[str], IncrementalDetokenizer]:
    detok = make(stop=stop)
    deltas = []
    for i in range(0, len(ids), step):
        deltas.append(detok.add(ids[i : i + step]).text)
        if detok.stopped:
            break
    deltas.append(detok.finish().text)
    return deltas, detok


def test_fixture_really_splits_characters_across_tokens(tokenizer: ModelTokenizer) -> None:
    ids = tokenizer.encode("😀", add_special_tokens=False)
    assert len(ids) > 1 and REPLACEMENT_CHAR in tokenizer.decode(ids[:1])


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("step", [1, 2, 3])
def test_stream_equals_full_decode_and_never_splits_a_character(
    tokenizer, make, text: str, step: int
) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    deltas, detok = _stream(make, ids, step=step)
    assert "".join(deltas) == tokenizer.decode(ids) == text
    assert not any(REPLACEMENT_CHAR in d for d in deltas)
    assert detok.text == text


def test_incomplete_character_is_held_then_released(tokenizer, make) -> None:
    ids = tokenizer.encode("a😀", add_special_tokens=False)
    detok = make()
    out = [detok.add([t]).text for t in ids]
    assert out[-1].endswith("😀") and all(REPLACEMENT_CHAR not in o for o in out)


def test_unresolved_bytes_are_released_at_finish(tokenizer, make) -> None:
    first_byte = tokenizer.encode("😀", add_special_tokens=False)[:1]
    detok = make()
    assert detok.add(first_byte).text == ""
    assert detok.finish().text.endswith(REPLACEMENT_CHAR)


def test_stop_string_spanning_tokens_cuts_the_output(tokenizer, make) -> None:
    text = "The answer is 42. Done, really."
    ids = tokenizer.encode(text, add_special_tokens=False)
    deltas, detok = _stream(make, ids, stop=["42. Do"])
    assert "".join(deltas) == "The answer is "
    assert detok.stopped == "42. Do"
    assert detok.add(ids[:1]).text == ""  # nothing after a stop
    deltas, detok = _stream(lambda stop: make(stop=stop, include_stop=True), ids, stop=["42. Do"])
    assert "".join(deltas) == "The answer is 42. Do" and detok.text == "The answer is 42. Do"


def test_tail_that_may_start_a_stop_string_is_held_back(tokenizer, make) -> None:
    stop = "STOPNOW"
    ids = tokenizer.encode("go STOP go", add_special_tokens=False)
    detok = make(stop=[stop])
    seen = ""
    for i, t in enumerate(ids):
        seen += detok.add([t]).text
        full = tokenizer.decode(ids[: i + 1])
        held = max((k for k in range(len(stop)) if k and full.endswith(stop[:k])), default=0)
        assert seen == full[: len(full) - held]
    assert seen + detok.finish().text == "go STOP go"


def test_earliest_stop_string_wins_and_emoji_stop(tokenizer, make) -> None:
    ids = tokenizer.encode("abc 😀 xyz end", add_special_tokens=False)
    deltas, detok = _stream(make, ids, stop=["end", "😀"])
    assert "".join(deltas) == "abc " and detok.stopped == "😀"


def test_stop_inside_one_token_batch(tokenizer, make) -> None:
    ids = tokenizer.encode("first line\nsecond line", add_special_tokens=False)
    detok = make(stop=["\n"])
    delta = detok.add(ids)
    assert delta.text == "first line" and delta.stop == "\n"


def test_special_tokens_are_skipped_by_default(tokenizer, make) -> None:
    ids = tokenizer.encode("hi", add_special_tokens=False) + [2]  # <|im_end|>
    assert "".join(_stream(make, ids)[0]) == "hi"
    detok = make(skip_special_tokens=False)
    assert detok.add(ids).text + detok.finish().text == "hi<|im_end|>"


def test_prompt_context_does_not_leak_into_output(tokenizer, make) -> None:
    prompt = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
    ids = tokenizer.encode(" Sure 世界", add_special_tokens=False)
    detok = make(prompt_token_ids=prompt)
    out = "".join(detok.add([t]).text for t in ids) + detok.finish().text
    assert out == " Sure 世界"


def test_byte_table_decodes_as_the_tokenizer_does(tokenizer: ModelTokenizer) -> None:
    table = tokenizer.byte_table
    assert table is not None
    rng = random.Random(1)
    size = tokenizer.vocab_size
    for n in range(300):
        ids = [rng.randrange(size + 4) for _ in range(1 + n % 40)]  # some past the vocabulary
        for skip in (True, False):
            assert table.bytes_of(ids, skip).decode("utf-8", "replace") == tokenizer.decode(ids, skip)
    # the same stream through both paths, token by token
    ids = [rng.randrange(size) for _ in range(400)]
    window = IncrementalDetokenizer(tokenizer.backend)
    by_bytes = IncrementalDetokenizer(tokenizer.backend, byte_table=table)
    for t in ids:
        window.add([t])
        by_bytes.add([t])
    assert window.text + window.finish().text == by_bytes.text + by_bytes.finish().text
    assert by_bytes.text == tokenizer.decode(ids)


def _held(text: str, stops: list[str]) -> int:
    """The hold-back rule by brute force: the longest tail (shorter than the longest stop) that some
    stop string starts with."""
    longest = max(map(len, stops)) - 1
    return max(
        (k for k in range(1, min(longest, len(text)) + 1) if any(s.startswith(text[-k:]) for s in stops)),
        default=0,
    )


def test_held_tails_and_stops_follow_the_rule_on_random_text(tokenizer, make) -> None:
    """Random stops and text, the first `unchecked` characters fed with stop checking off (min_tokens):
    those go out whole, a stop counts only where it starts after them, and a held tail may begin in
    them (then nothing is released until it resolves)."""
    rng = random.Random(3)
    char_ids = {c: tokenizer.encode(c, add_special_tokens=False) for c in "ab c"}
    assert all(len(ids) == 1 for ids in char_ids.values())
    for case in range(400):
        stops = [
            "".join(rng.choice("abc") for _ in range(rng.randint(1, 5))) for _ in range(rng.randint(1, 3))
        ]
        text = "".join(rng.choice("ab c") for _ in range(30))
        unchecked = 0 if case % 2 == 0 else rng.randint(1, 10)
        detok, seen = make(stop=stops), ""
        for i, c in enumerate(text):
            seen += detok.add(char_ids[c], check_stop=i >= unchecked).text
            full = text[: i + 1]
            if i < unchecked:
                assert detok.stopped is None and seen == full
                continue
            if detok.stopped is not None:
                first = min(p for s in stops if (p := full.find(s, unchecked)) != -1)
                assert seen == full[:first] and full.find(detok.stopped, unchecked) == first
                break
            assert all(full.find(s, unchecked) == -1 for s in stops)
            assert seen == full[: max(unchecked, len(full) - _held(full, stops))]
        assert detok.text == seen
