"""Bad input: ValueError naming the field, and the engine keeps serving everyone else."""

from __future__ import annotations

import pytest

from common import LLM, SamplingParams
from common.config import EngineConfig


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"top_k": 1.5}, "top_k"),
        ({"min_p": 2.0}, "min_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": "8"}, "max_tokens"),
        ({"presence_penalty": 3.0}, "presence_penalty"),
        ({"frequency_penalty": -2.5}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"n": 0}, "n"),
        ({"logprobs": 21}, "logprobs"),
        ({"seed": "x"}, "seed"),
        ({"seed": 2**64}, "seed"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"stop": [""]}, "stop"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"ignore_eos": "yes"}, "ignore_eos"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
        ({"stop": ["x"] * 65}, "stop"),
        ({"stop": "y" * 257}, "stop"),
        ({"logit_bias": {1: 100.5}}, "logit_bias"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias"),
        ({"logit_bias": {"1": 1.0}}, "logit_bias"),
        ({"logit_bias": {1: float("inf")}}, "logit_bias"),
        ({"logit_bias": [(1, 1.0), (1, 2.0)]}, "logit_bias"),
        ({"logit_bias": "1:1"}, "logit_bias"),
    ],
)
def test_sampling_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 0}, "max_tokens must be >= 1, got 0"),
        ({"top_k": -2}, "top_k must be >= -1, got -2"),
        ({"n": 200}, "n must be in [1, 128], got 200"),
    ],
)
def test_integer_ranges_read_as_written(kwargs, message):
    with pytest.raises(ValueError) as error:
        SamplingParams(**kwargs)
    assert str(error.value) == message


def test_logit_bias_is_kept_as_sorted_pairs():
    """A dict (as vLLM's API takes it) or pairs; pairs sorted by id, so equal biases compare equal."""
    assert SamplingParams(logit_bias={9: 1, 2: -100}).logit_bias == [(2, -100.0), (9, 1.0)]
    assert SamplingParams(logit_bias=[(9, 1.0), (2, -100)]) == SamplingParams(logit_bias={2: -100, 9: 1})
    assert SamplingParams(logit_bias={3: 1}).batch_key() is None  # its rows need the bias: no shared key


def test_sampling_params_accept_greedy_and_single_stop_string():
    assert SamplingParams(temperature=0).greedy and not SamplingParams(temperature=1e-6).greedy
    assert SamplingParams(stop="###").stop == ["###"]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
        ({"max_num_seqs": -1}, "max_num_seqs"),
        ({"kvcache_block_size": 24}, "kvcache_block_size"),
        ({"kvcache_block_size": 512}, "kvcache_block_size"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"device": "tpu"}, "device"),
        ({"dtype": "int8"}, "dtype"),
        ({"attention_backend": "magic"}, "attention_backend"),
        ({"role": "router"}, "role"),
        ({"max_model_len": 0}, "max_model_len"),
        ({"num_kvcache_blocks": 0}, "num_kvcache_blocks"),
    ],
)
def test_engine_config_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        EngineConfig(model="/some/model", **kwargs)


def test_unknown_engine_option_and_missing_model(tmp_path):
    with pytest.raises(ValueError, match="unknown engine option"):
        LLM(str(tmp_path), not_an_option=1)
    with pytest.raises(ValueError, match="config.json"):
        LLM(str(tmp_path))


@pytest.fixture(scope="module")
def llm(tiny_model_dirs):
    return LLM(tiny_model_dirs["llama"], num_kvcache_blocks=64, max_model_len=128)


def test_bad_prompts_raise_clear_errors(llm):
    greedy = SamplingParams(temperature=0, max_tokens=4)
    with pytest.raises(ValueError, match=r"prompts\[1\].*at least one token"):
        llm.generate([[1, 2], []], greedy, use_tqdm=False)
    for bad in ([1, 512], [1, -1], [1, True], [1, 2.0]):  # past either end, a bool, a float
        with pytest.raises(ValueError, match=rf"prompts\[0\].*token id {bad[1]!r} is outside the vocabulary"):
            llm.generate([bad], greedy, use_tqdm=False)
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate([[1] * 129], greedy, use_tqdm=False)
    with pytest.raises(ValueError, match="no tokenizer"):
        llm.generate(["text prompt"], greedy, use_tqdm=False)
    with pytest.raises(ValueError, match="sampling_params has 1 entries for 2 prompts"):
        llm.generate([[1], [2]], [greedy], use_tqdm=False)
    # Nothing was queued by the failed calls and the engine still serves.
    assert not llm.engine.has_unfinished
    assert len(llm.generate([[1, 2, 3]], greedy, use_tqdm=False)[0]["token_ids"]) == 4


def test_bad_request_mid_flight_does_not_disturb_others(llm):
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    expected = llm.generate([[5, 6, 7]], greedy, use_tqdm=False)[0]["token_ids"]
    engine = llm.engine
    seq = engine.add_request([5, 6, 7], greedy)
    engine.step()
    for bad in ([], [10**6], [-1], [1.5]):
        with pytest.raises(ValueError):
            engine.add_request(bad, greedy)
    while engine.has_unfinished:
        engine.step()
    assert seq.completion_token_ids == expected


def test_generation_stops_at_max_model_len(llm):
    out = llm.generate(
        [[1] * 120], SamplingParams(temperature=0, max_tokens=50, ignore_eos=True), use_tqdm=False
    )
    assert len(out[0]["token_ids"]) == 8 and out[0]["finish_reason"] == "length"
