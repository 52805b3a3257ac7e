"""From a validated OpenAI request to what the cluster runs: prompts as token ids + SamplingParams.

Everything a client can get wrong is answered here with a 400 naming the field: sampling values (via
SamplingParams), prompt token ids outside the vocabulary, roles or content the template cannot take
(or a final message it does not reproduce, for continue_final_message),
prompts that do not fit the context window, and structured-output schemas, regexes and grammars
that llguidance refuses. Defaults follow vLLM: max_tokens is 16 for
completions and "the rest of the context window" for chat; sampling fields a request leaves out take
the model's generation-config values (`GenerationDefaults`), whose max_new_tokens caps max_tokens.

`max_model_len=None` (no live workers yet) validates everything that does not depend on the workers
and skips the context-window check; the caller then answers 503 instead of running the plan.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from common.wire.generation_config import GenerationDefaults
from common.wire.sampling_params import SamplingParams
from common.wire.structured_output import GuidedRequest
from common.wire.token_ids import check_token_ids
from router.errors import APIError, bad_request, from_value_error, shorten
from router.protocol import ChatCompletionRequest, ChatPromptFields, CompletionRequest, _GenerationRequest
from router.tokenizer import CHAT_TEMPLATE_ARGUMENTS, ChatTemplateError, FinalMessageError, ModelTokenizer

COMPLETION_DEFAULT_MAX_TOKENS = 16
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class GenerationPlan:
    """One HTTP request's work: every prompt is sampled `sampling.n` times."""

    prompts: list[list[int]]
    sampling: SamplingParams
    stream: bool
    include_usage: bool
    skip_special_tokens: bool
    timeout: float | None = None  # the request's own end-to-end limit (seconds), if it set one
    continuous_usage: bool = False  # every streamed chunk carries the usage so far (include_usage too)
    tokens_as_ids: bool = False  # vLLM's return_tokens_as_token_ids: logprob tokens named `token_id:N`
    return_token_ids: bool = False  # vLLM's: prompt and output token ids in the response

    def sequence_params(self, sample_index: int) -> SamplingParams:
        """The sub-request's params: n=1 and, with a seed, seed + sample_index (distinct samples)."""
        seed = None if self.sampling.seed is None else self.sampling.seed + sample_index
        if self.sampling.n == 1 and seed == self.sampling.seed:
            return self.sampling  # already the sub-request's params: skip re-validating a copy
        return replace(self.sampling, n=1, seed=seed)


class RequestBuilder:
    def __init__(self, tokenizer: ModelTokenizer, defaults: GenerationDefaults | None = None) -> None:
        self.tokenizer = tokenizer
        self.defaults = defaults or GenerationDefaults()

    def completion(self, req: CompletionRequest, max_model_len: int | None) -> GenerationPlan:
        keep = _kept_prompt_tokens(req.truncate_prompt_tokens, max_model_len)
        if keep is None and isinstance(req.prompt, str):
            self._check_text_length(len(req.prompt), max_model_len)
        elif keep is None and req.prompt and all(isinstance(p, str) for p in req.prompt):
            self._check_text_length(max(len(p) for p in req.prompt if isinstance(p, str)), max_model_len)
        prompts = [
            ids[-keep:] if keep else ids
            for ids in self._completion_prompts(req.prompt, req.add_special_tokens)
        ]
        if req.logprobs is not None and not 0 <= req.logprobs <= MAX_TOP_LOGPROBS:
            raise bad_request(f"logprobs must be in [0, {MAX_TOP_LOGPROBS}]", param="logprobs")
        max_tokens = req.max_tokens if req.max_tokens is not None else COMPLETION_DEFAULT_MAX_TOKENS
        return self._plan(req, prompts, max_tokens, req.logprobs, max_model_len)

    def chat(self, req: ChatCompletionRequest, max_model_len: int | None) -> GenerationPlan:
        if req.top_logprobs is not None and not req.logprobs:
            raise bad_request("top_logprobs requires logprobs to be true", param="top_logprobs")
        if req.top_logprobs is not None and not 0 <= req.top_logprobs <= MAX_TOP_LOGPROBS:
            raise bad_request(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}]", param="top_logprobs")
        keep = _kept_prompt_tokens(req.truncate_prompt_tokens, max_model_len)
        if keep is None:
            self._check_text_length(sum(len(m.text()) for m in req.messages), max_model_len, "messages")
        prompt = self._chat_prompt(req)[-keep:] if keep else self._chat_prompt(req)
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        if max_tokens is None:
            max_tokens = (
                max(max_model_len - len(prompt), 1) if max_model_len else COMPLETION_DEFAULT_MAX_TOKENS
            )
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        return self._plan(req, [prompt], max_tokens, logprobs, max_model_len)

    def _check_text_length(self, chars: int, max_model_len: int | None, param: str = "prompt") -> None:
        """Refuse text that cannot fit the context window before tokenizing it: tokenizing holds the
        GIL on the event loop, and a multi-megabyte prompt would stall every other request."""
        if max_model_len is not None and chars > max_model_len * self.tokenizer.max_token_chars:
            raise APIError(
                400,
                f"This model's maximum context length is {max_model_len} tokens; the {param} text "
                f"({chars} characters) is longer than any {max_model_len} tokens can be.",
                param=param,
                code="context_length_exceeded",
            )

    def _chat_prompt(self, req: ChatCompletionRequest) -> list[int]:
        return self.tokenizer.encode(self.chat_text(req), add_special_tokens=req.add_special_tokens)

    def chat_text(self, req: ChatPromptFields) -> str:
        """The conversation rendered by the model's chat template: the prompt text of a chat request
        (and of /tokenize with messages)."""
        # "developer" is OpenAI's newer name for "system"; open-model templates only know "system".
        messages = [
            {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
            | ({"name": m.name} if m.name else {})
            for m in req.messages
        ]
        template_vars = _template_vars(req.chat_template_kwargs)
        if req.documents is not None:  # as transformers passes them: a template variable of that name
            template_vars["documents"] = req.documents
        if req.continue_final_message and req.add_generation_prompt:
            message = "continue_final_message needs add_generation_prompt set to false"
            raise bad_request(message, param="continue_final_message")
        try:
            return self.tokenizer.apply_chat_template(
                messages, req.add_generation_prompt, req.continue_final_message, **template_vars
            )
        except ChatTemplateError as e:
            raise bad_request(str(e), param="messages") from None
        except FinalMessageError as e:
            raise bad_request(str(e), param="continue_final_message") from None

    def _completion_prompts(self, prompt: str | list, add_special_tokens: bool) -> list[list[int]]:
        # The shape is checked (router/protocol.py): a list's first item tells which kind it is.
        if isinstance(prompt, str):
            prompts = [self.tokenizer.encode(prompt, add_special_tokens)]
        elif isinstance(prompt[0], str):
            prompts = [self.tokenizer.encode(p, add_special_tokens) for p in prompt]
        elif isinstance(prompt[0], int):
            prompts = [list(prompt)]
        else:
            prompts = [list(p) for p in prompt]
        for ids in prompts:
            if not ids:
                raise bad_request("prompt must not be empty", param="prompt")
            self._check_vocabulary("prompt", ids)
        return prompts

    def _check_vocabulary(self, name: str, ids: Sequence[int]) -> None:
        try:
            check_token_ids(name, ids, self.tokenizer.vocab_size)
        except ValueError as e:
            raise bad_request(str(e), param=name) from None

    def _plan(
        self,
        req: _GenerationRequest,
        prompts: list[list[int]],
        max_tokens: int,
        logprobs: int | None,
        max_model_len: int | None,
    ) -> GenerationPlan:
        sampling = self._sampling(req, self.defaults.max_tokens_for(max_tokens), logprobs)
        for ids in prompts:
            if max_model_len is not None:
                _check_context(len(ids), sampling.max_tokens, max_model_len)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        continuous = include_usage and bool(req.stream_options and req.stream_options.continuous_usage_stats)
        if req.stream_options is not None and not req.stream:
            raise bad_request("stream_options is only allowed when stream is true", param="stream_options")
        return GenerationPlan(
            prompts,
            sampling,
            req.stream,
            include_usage,
            req.skip_special_tokens,
            req.timeout,
            continuous,
            req.return_tokens_as_token_ids,
            req.return_token_ids,
        )

    def _sampling(self, req: _GenerationRequest, max_tokens: int, logprobs: int | None) -> SamplingParams:
        given: dict[str, Any] = self.defaults.fill(
            {
                "temperature": req.temperature,
                "top_p": req.top_p,
                "top_k": req.top_k,
                "min_p": req.min_p,
                "presence_penalty": req.presence_penalty,
                "frequency_penalty": req.frequency_penalty,
                "repetition_penalty": req.repetition_penalty,
                "stop": [req.stop] if isinstance(req.stop, str) else req.stop,
                "stop_token_ids": req.stop_token_ids,
                "seed": req.seed,
            }
        )
        grammar = _grammar(req)
        bias = _logit_bias(req.logit_bias)
        self._check_vocabulary("stop_token_ids", req.stop_token_ids or [])
        self._check_vocabulary("logit_bias", list(bias))
        try:
            return SamplingParams(
                grammar=grammar,
                logit_bias=list(bias.items()),
                max_tokens=max_tokens,
                min_tokens=req.min_tokens,
                ignore_eos=req.ignore_eos,
                include_stop_str_in_output=req.include_stop_str_in_output,
                cache_salt=req.cache_salt,
                logprobs=logprobs,
                n=req.n,
                **{k: v for k, v in given.items() if v is not None},
            )
        except ValueError as e:
            raise from_value_error(e) from None


def _kept_prompt_tokens(truncate: int | None, max_model_len: int | None) -> int | None:
    """vLLM's truncate_prompt_tokens: keep a prompt's last k tokens (-1: the context window's worth);
    None: the prompt is not truncated (and its text is length-checked before tokenizing instead: with
    truncation any length is acceptable, and the body limit bounds the work)."""
    if truncate is None or (truncate == -1 and max_model_len is None):
        return None
    if truncate == -1:
        return max_model_len
    if truncate < 1:
        raise bad_request(
            f"truncate_prompt_tokens must be >= 1 or -1, got {truncate}", param="truncate_prompt_tokens"
        )
    return truncate


def _template_vars(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """`chat_template_kwargs` as template variables; the names the request sets through its own
    fields are refused (a 400), not silently replaced."""
    taken = sorted(set(kwargs or ()) & CHAT_TEMPLATE_ARGUMENTS)
    if taken:
        raise bad_request(
            f"chat_template_kwargs cannot set {', '.join(taken)} (request fields of their own)",
            param="chat_template_kwargs",
        )
    return dict(kwargs or {})


def _grammar(req: _GenerationRequest) -> str | None:
    """The request's structured-output grammar; a bad schema, regex or choice list is a 400 naming
    the field (the message starts with it, e.g. "response_format.json_schema.schema ...")."""
    guided = GuidedRequest(
        req.response_format,
        req.guided_json,
        req.guided_regex,
        req.guided_choice,
        req.guided_grammar,
        req.structured_outputs,
    )
    try:
        return guided.grammar()
    except ValueError as e:
        message = str(e)
        field = re.match(r"[A-Za-z_]+", message)
        raise bad_request(message, param=field.group(0) if field else None) from None


def _logit_bias(given: dict[str, float] | None) -> dict[int, float]:
    """OpenAI's logit_bias, whose keys are token ids written as JSON strings, keyed by int."""
    bias: dict[int, float] = {}
    for key, value in (given or {}).items():
        if not key.isdigit() or not key.isascii():
            raise bad_request(f"logit_bias keys must be token ids, got {shorten(key)!r}", param="logit_bias")
        if int(key) in bias:
            raise bad_request(f"logit_bias names token id {int(key)} twice", param="logit_bias")
        bias[int(key)] = value
    return bias


def _check_context(prompt_len: int, max_tokens: int, max_model_len: int) -> None:
    if prompt_len >= max_model_len:
        raise APIError(
            400,
            f"This model's maximum context length is {max_model_len} tokens; the prompt has {prompt_len}.",
            param="prompt",
            code="context_length_exceeded",
        )
    if prompt_len + max_tokens > max_model_len:
        raise APIError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt_len + max_tokens} tokens ({prompt_len} in the prompt, {max_tokens} for the "
            "completion).",
            param="max_tokens",
            code="context_length_exceeded",
        )
