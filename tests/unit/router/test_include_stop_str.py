"""include_stop_str_in_output through the router: the stop string that ended the text stays in it,
on both endpoints, streamed or not; without it the text ends before the stop string."""

from __future__ import annotations

import asyncio
import json

from tests.unit.router.fake_workers import Script
from tests.unit.router.harness import running_router

REPLY = " The sea is wide. The end."
EOS = 2


def _texts(model_dir, tokenizer, bodies: list[tuple[str, dict]]) -> list[str]:
    reply = tokenizer.encode(REPLY, add_special_tokens=False) + [EOS]
    specs = [("prefill-0", "prefill", Script(reply=reply)), ("decode-0", "decode", Script(reply=reply))]

    async def main() -> list[str]:
        texts = []
        async with running_router(model_dir, tokenizer, specs) as h:
            for path, body in bodies:
                r = await h.client.post(path, json=body)
                assert r.status_code == 200, r.text
                texts.append(_text(r.text, body.get("stream", False)))
        return texts

    return asyncio.run(main())


def _text(raw: str, stream: bool) -> str:
    if not stream:
        choice = json.loads(raw)["choices"][0]
        assert choice["finish_reason"] == "stop"
        return choice["text"] if "text" in choice else choice["message"]["content"]
    text = ""
    for block in raw.split("\n\n"):
        if block.startswith("data: {"):
            for choice in json.loads(block[len("data: ") :])["choices"]:
                text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
    return text


def test_the_stop_string_stays_when_asked_for(model_dir, tokenizer) -> None:
    bodies = [
        ("/v1/completions", {"prompt": "Sea?", "stop": ["wide."], "include_stop_str_in_output": True}),
        (
            "/v1/completions",
            {"prompt": "Sea?", "stop": ["wide."], "stream": True, "include_stop_str_in_output": True},
        ),
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "Sea?"}],
                "stop": "wide.",
                "include_stop_str_in_output": True,
            },
        ),
        ("/v1/completions", {"prompt": "Sea?", "stop": ["wide."]}),
    ]
    assert _texts(model_dir, tokenizer, bodies) == [" The sea is wide."] * 3 + [" The sea is "]
