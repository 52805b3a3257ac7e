"""Requests that leave sampling fields out get the model's generation-config values (vLLM's
`--generation-config auto|vllm|PATH`): what the request builder plans, and what workers receive."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from common.wire.generation_config import GenerationDefaults, load_generation_defaults
from common.wire.messages import PrefillRequest
from common.wire.sampling_params import SamplingParams
from router.__main__ import parse_args
from router.errors import APIError
from router.protocol import ChatCompletionRequest, CompletionRequest
from router.request_builder import COMPLETION_DEFAULT_MAX_TOKENS, RequestBuilder
from tests.unit.router.conftest import TOKENIZER_FILES
from tests.unit.router.fake_workers import Script
from tests.unit.router.harness import running_router

MAX_MODEL_LEN = 4096
MODEL_FILE = {"eos_token_id": 2, "temperature": 0.3, "top_p": 0.8, "top_k": 20, "min_p": 0.05}
CAPPED_FILE = {**MODEL_FILE, "repetition_penalty": 1.1, "max_new_tokens": 64}
MSGS = [{"role": "user", "content": "What is the capital of France?"}]


def _with_generation_config(model_dir: Path, target: Path, generation: dict) -> Path:
    """A copy of the router's model files whose generation_config.json is `generation`."""
    target.mkdir(parents=True)
    for name in TOKENIZER_FILES:
        if (model_dir / name).is_file():
            shutil.copy(model_dir / name, target / name)
    (target / "generation_config.json").write_text(json.dumps(generation))
    return target


def _builder(tokenizer, generation: dict | None) -> RequestBuilder:
    return RequestBuilder(tokenizer, GenerationDefaults.from_json(generation) if generation else None)


def _completion(builder: RequestBuilder, **fields) -> SamplingParams:
    return builder.completion(CompletionRequest(prompt="Hello", **fields), MAX_MODEL_LEN).sampling


def _chat(builder: RequestBuilder, **fields) -> tuple[SamplingParams, int]:
    plan = builder.chat(ChatCompletionRequest(messages=MSGS, **fields), MAX_MODEL_LEN)
    return plan.sampling, len(plan.prompts[0])


def test_missing_fields_take_the_models_values(tokenizer) -> None:
    sampling = _completion(_builder(tokenizer, CAPPED_FILE))
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (0.3, 0.8, 20)
    assert (sampling.min_p, sampling.repetition_penalty) == (0.05, 1.1)
    # Fields the generation config does not cover keep the engine's defaults.
    assert (sampling.presence_penalty, sampling.frequency_penalty, sampling.seed) == (0.0, 0.0, None)


def test_a_requests_own_values_win(tokenizer) -> None:
    given = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}
    sampling = _completion(_builder(tokenizer, CAPPED_FILE), **given)
    assert {k: getattr(sampling, k) for k in given} == given
    chat, _ = _chat(_builder(tokenizer, CAPPED_FILE), temperature=0.7)
    assert (chat.temperature, chat.top_p) == (0.7, 0.8)  # only what the request set is its own


def test_max_new_tokens_caps_and_defaults_max_tokens(tokenizer) -> None:
    builder = _builder(tokenizer, CAPPED_FILE)
    assert _completion(builder).max_tokens == COMPLETION_DEFAULT_MAX_TOKENS  # 16 is under the cap
    assert _completion(builder, max_tokens=10).max_tokens == 10
    assert _completion(builder, max_tokens=1000).max_tokens == 64
    assert _chat(builder)[0].max_tokens == 64  # chat's "rest of the window", capped
    assert _chat(builder, max_completion_tokens=5)[0].max_tokens == 5


def test_without_model_defaults_the_engine_defaults_hold(tokenizer) -> None:
    for builder in (_builder(tokenizer, None), _builder(tokenizer, {"eos_token_id": 2})):
        assert _completion(builder) == SamplingParams(max_tokens=COMPLETION_DEFAULT_MAX_TOKENS)
        sampling, prompt_len = _chat(builder)
        assert sampling.temperature == 1.0 and sampling.max_tokens == MAX_MODEL_LEN - prompt_len


def test_bad_request_values_are_still_refused(tokenizer) -> None:
    with pytest.raises(APIError) as exc:
        _completion(_builder(tokenizer, CAPPED_FILE), temperature=-1.0)
    assert exc.value.status == 400 and exc.value.param == "temperature"


def _received_sampling(model_dir: Path, tokenizer, body: dict, **overrides) -> SamplingParams:
    """Send `body` through a router with fake workers; the sampling the prefill worker received."""
    specs = [("prefill-0", "prefill", Script(reply=[5, 2])), ("decode-0", "decode", Script(reply=[5, 2]))]

    async def main() -> SamplingParams:
        async with running_router(model_dir, tokenizer, specs, **overrides) as h:
            r = await h.client.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            (request,) = h.worker("prefill-0").of_type(PrefillRequest)
            return request.sampling

    return asyncio.run(main())


def test_the_router_flag_picks_the_source(model_dir: Path, tokenizer, tmp_path: Path) -> None:
    model = _with_generation_config(model_dir, tmp_path / "model", MODEL_FILE)
    other = _with_generation_config(model_dir, tmp_path / "other", {"temperature": 0.9, "top_k": 5})
    body = {"messages": MSGS, "max_tokens": 4}
    auto = _received_sampling(model, tokenizer, body)  # "auto" is the default
    assert (auto.temperature, auto.top_p, auto.top_k, auto.min_p) == (0.3, 0.8, 20, 0.05)
    vllm = _received_sampling(model, tokenizer, body, generation_config="vllm")
    assert vllm == SamplingParams(max_tokens=4)
    path = _received_sampling(model, tokenizer, body, generation_config=str(other))
    assert (path.temperature, path.top_p, path.top_k) == (0.9, 1.0, 5)
    own = _received_sampling(model, tokenizer, {**body, "temperature": 0, "top_k": 0})
    assert (own.temperature, own.top_p, own.top_k) == (0.0, 0.8, 0)


def test_router_cli_refuses_an_unusable_generation_config(model_dir: Path, tmp_path: Path, capsys) -> None:
    bad = _with_generation_config(model_dir, tmp_path / "bad", {"temperature": -2})
    for choice, says in ((str(bad), "temperature"), (str(tmp_path / "nowhere"), "generation_config")):
        with pytest.raises(SystemExit) as exc:
            parse_args(["--model", str(model_dir), "--generation-config", choice])
        assert exc.value.code == 2 and says in capsys.readouterr().err
    config, _ = parse_args(["--model", str(model_dir), "--generation-config", "vllm"])
    assert config.generation_config == "vllm"
    assert load_generation_defaults(config.generation_config, config.model) == GenerationDefaults()
