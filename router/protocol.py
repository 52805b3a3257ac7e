"""OpenAI-compatible request models for /v1/completions and /v1/chat/completions (the responses:
router/response_models.py).

Requests are validated strictly (no "1" for 1, no 1.5 for an int); unknown fields are ignored, as the
OpenAI clients send fields this server does not use. Range checks live in SamplingParams, which the
router builds from each request, so the rules are written once.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
)

from common.wire.wire_fields import only_type

ChatRole = Literal["system", "developer", "user", "assistant", "tool"]

# Every integer a worker receives travels through msgpack, which stops at 64 bits: a larger one would
# fail at dispatch (a 500, or worse, in the worker) instead of here (a 400 naming the field).
Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
# One HTTP request fans out into prompts x n sequences; without a bound, a few MB of
# `"prompt": [[1], [1], ...]` with n=128 would make the router build millions of them.
MAX_SEQUENCES_PER_REQUEST = 4096


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: with include_usage, every chunk carries the usage so far


class _GenerationRequest(_Strict):
    """Fields shared by both endpoints (vLLM extensions included: top_k, min_p, ignore_eos, ...)."""

    model: str | None = None
    max_tokens: Int64 | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: Int64 | None = None
    min_p: float | None = None
    n: Int64 = 1
    stop: str | list[str] | None = None
    stop_token_ids: list[Int64] | None = None
    seed: Int64 | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None  # JSON object keys are strings: token ids as text
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    truncate_prompt_tokens: Int64 | None = None  # vLLM's: keep the prompt's last k tokens (-1: the window's)
    min_tokens: Int64 = 0
    skip_special_tokens: bool = True
    return_tokens_as_token_ids: bool = False  # vLLM's: logprob tokens named `token_id:N`
    return_token_ids: bool = False  # vLLM's: the prompt's and the output's token ids in the response
    cache_salt: str | None = None  # vLLM's: prefix-cache reuse only among requests with the same salt
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # pdserve extension: this request's end-to-end limit in seconds, within the router's own.
    timeout: float | None = Field(default=None, gt=0, le=86400)
    # Structured output (common/wire/structured_output.py): OpenAI's response_format, or vLLM's extras.
    response_format: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: dict[str, Any] | None = None  # vLLM's since v0.12: json, regex, choice, grammar, ...


class CompletionRequest(_GenerationRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    add_special_tokens: bool = True  # vLLM's: the tokenizer's own (e.g. a BOS) around text prompts
    logprobs: Int64 | None = None
    echo: bool = False
    suffix: str | None = None

    @field_validator("prompt", mode="wrap")
    @classmethod
    def _prompt_shape(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """The exact shape check, in place of the union's: pydantic validates a list against each
        member in turn, erring on every item of a long token-id list for the string members (~50 us
        per 512 ids); the annotation stays for the schema."""
        if isinstance(value, str):
            return value
        if isinstance(value, list) and value:
            if all(isinstance(v, str) for v in value):
                return value
            if only_type(value, int):
                return value
            if all(isinstance(v, list) and v and only_type(v, int) for v in value):
                return value
        raise ValueError(
            "prompt must be a string, a non-empty list of strings, a list of token ids or a list of "
            "non-empty token-id lists"
        )

    @field_validator("prompt")
    @classmethod
    def _bounded_fanout(cls, value: Any, info: ValidationInfo) -> Any:
        num_prompts = 1 if isinstance(value, str) or _is_token(value[0]) else len(value)
        n = info.data.get("n", 1)  # validated before prompt (declared first); absent if it was invalid
        if num_prompts > 1 and num_prompts * max(n, 1) > MAX_SEQUENCES_PER_REQUEST:
            raise ValueError(
                f"{num_prompts} prompts x n={n} is more than {MAX_SEQUENCES_PER_REQUEST} sequences"
            )
        return value


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: ChatRole
    # Only an assistant message may come without content (OpenAI's rule: one that called tools).
    content: str | list[TextPart] | None = Field(default=None, validate_default=True)
    name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, value: Any, info: ValidationInfo) -> Any:
        role = info.data.get("role")  # absent if the role itself was invalid: that error comes first
        if value is None and role is not None and role != "assistant":
            raise ValueError(f"content is required for a {role} message")
        if isinstance(value, list):
            for part in value:
                if isinstance(part, dict) and part.get("type") not in ("text", None):
                    raise ValueError(f"content part type {part.get('type')!r} is not supported (text only)")
        return value

    def text(self) -> str:
        """The message's content as one string (text parts are joined with newlines)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)


class ChatPromptFields(_Strict):
    """What renders a conversation into a prompt (RequestBuilder.chat_text): the chat route's fields
    and /tokenize's."""

    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True
    # vLLM's extensions: leave the last (assistant) message open for the model to continue, and extra
    # variables for the chat template (e.g. Qwen3's enable_thinking).
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    documents: list[dict[str, str]] | None = None  # vLLM's: for templates that render retrieved documents
    add_special_tokens: bool = False  # vLLM's: the template writes the special tokens itself


class ChatCompletionRequest(ChatPromptFields, _GenerationRequest):
    max_completion_tokens: Int64 | None = None
    logprobs: bool = False
    top_logprobs: Int64 | None = None
    tools: list[Any] | None = None


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
