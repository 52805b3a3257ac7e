"""The speculative benchmark's prompt sets: copy-long's texts are what its name promises."""

from __future__ import annotations

import ast
import re

from benchmarks.speculative.speculative_prompts import LONG_RENAMES, LONG_TYPOS, WORKLOADS, _text


def test_every_workload_has_eight_prompts():
    # batch 1 runs each alone, batch 8 all at once: the figures assume eight
    assert {name: len(texts) for name, texts in WORKLOADS.items()} == {"copy": 8, "copy-long": 8, "free": 8}


def test_long_code_is_valid_python_with_the_variable_to_rename():
    for name, old, new in LONG_RENAMES:
        code = _text(name)
        ast.parse(code)
        assert 40 <= len(code.splitlines()) <= 60, name
        assert len(re.findall(rf"\b{old}\b", code)) >= 4, name  # worth renaming
        assert new not in code, name


def test_long_passages_have_250_to_300_words():
    for name in LONG_TYPOS:
        assert 250 <= len(_text(name).split()) <= 300, name
