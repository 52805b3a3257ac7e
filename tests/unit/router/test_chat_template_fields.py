"""vLLM's chat fields end to end: continue_final_message, chat_template_kwargs and documents shape the
prompt the prefill worker receives (the router over the real protocol, scripted workers)."""

from __future__ import annotations

import asyncio

import pytest

from common.wire.messages import PrefillRequest
from router.tokenizer import ModelTokenizer
from tests.unit.router.fake_workers import Script
from tests.unit.router.harness import running_router

EOS = 2
CHAT = "/v1/chat/completions"


def _prompt_sent(model_dir, tokenizer: ModelTokenizer, body: dict) -> list[int]:
    reply = tokenizer.encode(" blue", add_special_tokens=False) + [EOS]
    specs = [("prefill-0", "prefill", Script(reply=reply)), ("decode-0", "decode", Script(reply=reply))]

    async def main() -> list[int]:
        async with running_router(model_dir, tokenizer, specs) as h:
            r = await h.client.post(CHAT, json=body)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"] == " blue"
            return h.worker("prefill-0").of_type(PrefillRequest)[0].prompt_token_ids

    return asyncio.run(main())


def test_continue_final_message_sends_the_open_message_as_transformers_renders_it(
    model_dir, tokenizer
) -> None:
    transformers = pytest.importorskip("transformers")
    messages = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "The sky is"}]
    body = {"messages": messages, "continue_final_message": True, "add_generation_prompt": False}
    reference = transformers.AutoTokenizer.from_pretrained(str(model_dir)).apply_chat_template(
        messages, tokenize=False, add_generation_prompt=False, continue_final_message=True
    )
    assert reference.endswith("The sky is")
    assert _prompt_sent(model_dir, tokenizer, body) == tokenizer.encode(reference, add_special_tokens=False)


def test_chat_template_kwargs_reach_the_template(model_dir, tokenizer) -> None:
    template = "{% for m in messages %}{{ m.content | upper if shout else m.content }}{% endfor %}"
    shouting = ModelTokenizer(tokenizer.backend, tokenizer.special, template, tokenizer.eos_token_ids)
    messages = [{"role": "user", "content": "quiet please"}]
    for kwargs, text in (({"shout": True}, "QUIET PLEASE"), ({"shout": False}, "quiet please")):
        body = {"messages": messages, "chat_template_kwargs": kwargs}
        assert _prompt_sent(model_dir, shouting, body) == tokenizer.encode(text, add_special_tokens=False)


def test_documents_reach_the_template_as_transformers_passes_them(model_dir, tokenizer) -> None:
    transformers = pytest.importorskip("transformers")
    template = (
        "{% for d in documents or [] %}[{{ d.title }}: {{ d.text }}]{% endfor %}"
        "{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    citing = ModelTokenizer(tokenizer.backend, tokenizer.special, template, tokenizer.eos_token_ids)
    messages = [{"role": "user", "content": "Which colour?"}]
    documents = [{"title": "sky", "text": "The sky is blue."}]
    reference = transformers.AutoTokenizer.from_pretrained(str(model_dir)).apply_chat_template(
        messages, tokenize=False, chat_template=template, documents=documents
    )
    assert reference == "[sky: The sky is blue.]Which colour?"
    body = {"messages": messages, "documents": documents}
    assert _prompt_sent(model_dir, citing, body) == tokenizer.encode(reference, add_special_tokens=False)
