"""vLLM's add_special_tokens: a text prompt gets the tokenizer's special tokens (a BOS here) unless the
request says false; a chat prompt, whose template writes its own, gets them only if it says true."""

from __future__ import annotations

from tokenizers import Tokenizer, models, pre_tokenizers, processors

from router.protocol import ChatCompletionRequest, CompletionRequest
from router.request_builder import RequestBuilder
from router.tokenizer import ModelTokenizer, SpecialTokens

BOS, HELLO, WORLD = 1, 2, 3


def _builder() -> RequestBuilder:
    backend = Tokenizer(models.WordLevel({"[UNK]": 0, "[BOS]": BOS, "hello": HELLO, "world": WORLD}, "[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(single="[BOS] $A", special_tokens=[("[BOS]", BOS)])
    template = "{% for m in messages %}{{ m.content }} {% endfor %}"
    return RequestBuilder(ModelTokenizer(backend, SpecialTokens(bos_token="[BOS]"), template))


def test_text_prompts_get_special_tokens_unless_told_not_to() -> None:
    builder = _builder()
    assert builder.completion(CompletionRequest(prompt="hello world"), 64).prompts == [[BOS, HELLO, WORLD]]
    plan = builder.completion(CompletionRequest(prompt=["hello", "world"], add_special_tokens=False), 64)
    assert plan.prompts == [[HELLO], [WORLD]]
    ids = builder.completion(CompletionRequest(prompt=[HELLO, WORLD], add_special_tokens=True), 64)
    assert ids.prompts == [[HELLO, WORLD]]  # token ids are sent as they are


def test_chat_prompts_get_them_only_when_asked() -> None:
    builder = _builder()
    messages = [{"role": "user", "content": "hello world"}]
    assert builder.chat(ChatCompletionRequest(messages=messages, max_tokens=4), 64).prompts == [
        [HELLO, WORLD]
    ]
    plan = builder.chat(ChatCompletionRequest(messages=messages, max_tokens=4, add_special_tokens=True), 64)
    assert plan.prompts == [[BOS, HELLO, WORLD]]
