"""Each step's class (common/multiplex/step_classes.py), on real tiny engines on the CPU: what the
worker's stats line and `pd_multiplex.py --step-classes` split the steps' wall time by."""

from __future__ import annotations

import pytest

from common.multiplex.step_classes import StepClassifier
from tests.unit.common.multiplex.tiny_llm import GREEDY, tiny_llm


def _classes(llm, long_prompt_at: int) -> list[str]:
    """Each step's class while a 3-token request decodes and a 79-token prompt arrives at step
    `long_prompt_at` (the tiny engine's budget is 32 tokens a step: three chunks)."""
    engine = llm.engine
    classifier = StepClassifier(engine.multiplexer)
    engine.add_request([5, 6, 7], GREEDY, request_id="short")
    classes: list[str] = []
    while engine.has_unfinished:
        if len(classes) == long_prompt_at:
            engine.add_request(list(range(1, 80)), GREEDY, request_id="long")
        classifier.before()
        result = engine.step()
        classes.append(classifier.after(result.num_prefill_tokens))
    return classes


@pytest.mark.parametrize("ahead", [False, True])
def test_multiplexed_steps_are_classed_by_their_chunks(tiny_model_dirs, ahead):
    classes = _classes(tiny_llm(tiny_model_dirs["qwen3"], pd_multiplex=True, async_scheduling=ahead), 3)
    launches = [i for i, c in enumerate(classes) if c in ("launch", "resolve+launch")]
    assert classes[0] == "launch" and classes[1:3] == ["solo", "solo"]  # the short prompt, then decode
    assert len(launches) == 4  # the short prompt's chunk and the long one's three
    assert all(classes[i + 1] == "beside, 1st" for i in launches[1:])  # the step after each launch
    resolved = classes.count("resolve") + classes.count("resolve+launch")
    assert resolved == 3 and classes[-1] == "solo"  # each chunk beside decode resolved; then decode alone


def test_aggregated_steps_are_decode_or_with_prefill(tiny_model_dirs):
    classes = _classes(tiny_llm(tiny_model_dirs["qwen3"]), 3)
    assert set(classes) == {"decode", "with prefill"}
    assert classes[0] == "with prefill" and classes[1:3] == ["decode", "decode"]
    assert classes.count("with prefill") == 1 + 3  # the short prompt's step and the long one's chunks
