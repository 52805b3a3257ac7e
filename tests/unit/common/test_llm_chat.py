"""The offline LLM's vLLM-shaped inputs on the default model: `chat` renders a conversation to the
prompt the router would send for it (its own template renderer, router/tokenizer.py) and answers as
`generate` on those ids; several conversations answer in order; `generate` takes vLLM's prompt dicts;
bad arguments are ValueErrors naming what is wrong."""

from __future__ import annotations

import pytest

from common import LLM, SamplingParams
from common.tools.default_model import prepare_default_model
from router.tokenizer import ModelTokenizer

GREEDY = SamplingParams(temperature=0, max_tokens=12)
SKY = [{"role": "user", "content": "What colour is the sky?"}]
SEA = [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Name a sea."}]


@pytest.fixture(scope="module")
def path() -> str:
    return str(prepare_default_model(progress=False))


@pytest.fixture(scope="module")
def llm(path) -> LLM:
    return LLM(path, num_kvcache_blocks=64, max_model_len=512)


def test_a_conversation_answers_as_the_routers_prompt_does(llm, path) -> None:
    router_ids = ModelTokenizer.from_dir(path).encode_chat(SKY)
    want = llm.generate([router_ids], GREEDY, use_tqdm=False)[0]
    got = llm.chat(SKY, GREEDY, use_tqdm=False)
    assert len(got) == 1 and got[0]["token_ids"] == want["token_ids"] and got[0]["text"] == want["text"]


def test_several_conversations_answer_in_order(llm) -> None:
    both = llm.chat([SKY, SEA], GREEDY, use_tqdm=False)
    assert [r["token_ids"] for r in both] == [
        llm.chat(c, GREEDY, use_tqdm=False)[0]["token_ids"] for c in (SKY, SEA)
    ]


def test_continue_final_message_leaves_the_last_message_open(llm) -> None:
    open_turn = SKY + [{"role": "assistant", "content": "The sky is"}]
    text = llm.tokenizer.apply_chat_template(open_turn, tokenize=False, continue_final_message=True)
    assert text.endswith("The sky is")
    want = llm.generate([llm.tokenizer.encode(text, add_special_tokens=False)], GREEDY, use_tqdm=False)[0]
    got = llm.chat(
        open_turn, GREEDY, use_tqdm=False, add_generation_prompt=False, continue_final_message=True
    )
    assert got[0]["token_ids"] == want["token_ids"]


@pytest.mark.parametrize(
    "messages, kwargs, match",
    [
        ([], {}, "list of messages"),
        ([[]], {}, r"messages\[0\] must be a non-empty list"),
        ([{"content": "no role"}], {}, r"messages\[0\]: every message"),
        (SKY, {"continue_final_message": True}, "add_generation_prompt=False"),
    ],
)
def test_bad_arguments_are_value_errors(llm, messages, kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        llm.chat(messages, GREEDY, use_tqdm=False, **kwargs)


def test_generate_takes_vllms_prompt_dicts(llm) -> None:
    ids = llm.tokenizer.encode("The capital of France is")
    want = llm.generate([ids, "The capital of France is"], GREEDY, use_tqdm=False)
    got = llm.generate(
        [{"prompt_token_ids": ids}, {"prompt": "The capital of France is"}], GREEDY, use_tqdm=False
    )
    assert [r["token_ids"] for r in got] == [r["token_ids"] for r in want]
    assert (
        llm.generate({"prompt_token_ids": ids}, GREEDY, use_tqdm=False)[0]["token_ids"]
        == want[0]["token_ids"]
    )
    for bad, match in (
        ({"prompt": "x", "prompt_token_ids": ids}, "exactly one"),
        ({"multi_modal_data": {}}, "exactly one"),
        ({"prompt": 5}, r"\['prompt'\] must be a string"),
        ({"prompt_token_ids": "1 2"}, "must be a list of token ids"),
    ):
        with pytest.raises(ValueError, match=match):
            llm.generate([bad], GREEDY, use_tqdm=False)
