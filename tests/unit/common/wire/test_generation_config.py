"""The model's sampling defaults: which file `auto|vllm|PATH` reads, what is taken, and the merge rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.wire.generation_config import GenerationDefaults, load_generation_defaults
from common.wire.sampling_params import SamplingParams

# A generation_config.json as transformers writes it: sampling keys among others the router ignores.
FILE = {
    "bos_token_id": 1,
    "eos_token_id": 2,
    "do_sample": True,
    "temperature": 0.3,
    "top_p": 0.8,
    "top_k": 20,
    "min_p": 0.05,
    "repetition_penalty": 1.1,
    "max_new_tokens": 64,
    "transformers_version": "5.24.0",
}
FROM_FILE = {
    "temperature": 0.3,
    "top_p": 0.8,
    "top_k": 20,
    "min_p": 0.05,
    "repetition_penalty": 1.1,
    "max_tokens": 64,
}


def _model_dir(root: Path, generation: dict | str | None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text("{}")
    if generation is not None:
        text = generation if isinstance(generation, str) else json.dumps(generation)
        (root / "generation_config.json").write_text(text)
    return root


def test_auto_reads_the_model_directory(tmp_path: Path) -> None:
    model = _model_dir(tmp_path / "m", FILE)
    assert load_generation_defaults("auto", model).as_dict() == FROM_FILE


def test_auto_without_a_file_or_sampling_keys_has_no_defaults(tmp_path: Path) -> None:
    assert load_generation_defaults("auto", _model_dir(tmp_path / "a", None)).as_dict() == {}
    eos_only = _model_dir(tmp_path / "b", {"eos_token_id": 2, "temperature": None})
    assert load_generation_defaults("auto", eos_only).as_dict() == {}


def test_vllm_ignores_the_models_file(tmp_path: Path) -> None:
    model = _model_dir(tmp_path / "m", FILE)
    assert load_generation_defaults("vllm", model) == GenerationDefaults()


def test_a_path_reads_that_directory_or_file_not_the_models(tmp_path: Path) -> None:
    model = _model_dir(tmp_path / "m", {"temperature": 0.9})
    other = _model_dir(tmp_path / "other", FILE)
    assert load_generation_defaults(str(other), model).as_dict() == FROM_FILE
    assert load_generation_defaults(str(other / "generation_config.json"), model).as_dict() == FROM_FILE


def test_a_path_without_the_file_is_refused(tmp_path: Path) -> None:
    model = _model_dir(tmp_path / "m", FILE)
    empty = _model_dir(tmp_path / "empty", None)
    for choice in (str(empty), str(tmp_path / "missing"), "Auto"):
        with pytest.raises(ValueError, match="generation_config"):
            load_generation_defaults(choice, model)


@pytest.mark.parametrize(
    ("content", "field"),
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": 2.5}, "top_k"),
        ({"max_new_tokens": 0}, "max_tokens"),
        ({"repetition_penalty": "high"}, "repetition_penalty"),
        ([0.2], "JSON object"),
        ("{not json", "cannot read"),
    ],
)
def test_bad_files_fail_naming_the_file_and_field(tmp_path: Path, content, field: str) -> None:
    model = _model_dir(tmp_path / "m", content)
    with pytest.raises(ValueError, match=field) as exc:
        load_generation_defaults("auto", model)
    assert "generation_config.json" in str(exc.value)


def test_fill_keeps_the_requests_values_and_fills_the_gaps() -> None:
    defaults = GenerationDefaults(**FROM_FILE)
    given = {"temperature": 0.0, "top_p": None, "top_k": None, "presence_penalty": None, "seed": 7}
    filled = defaults.fill(given)
    assert filled == {
        "temperature": 0.0,  # the request's own value wins, even 0 (greedy)
        "top_p": 0.8,
        "top_k": 20,
        "min_p": 0.05,
        "repetition_penalty": 1.1,
        "presence_penalty": None,  # not a generation-config field: left as the request gave it
        "seed": 7,
    }
    assert "max_tokens" not in filled  # a cap, applied by max_tokens_for
    assert given["top_p"] is None  # the request's map is not modified


def test_max_new_tokens_is_a_cap_and_the_default() -> None:
    capped = GenerationDefaults(max_tokens=64)
    assert capped.max_tokens_for(16) == 16
    assert capped.max_tokens_for(8000) == 64
    assert GenerationDefaults().max_tokens_for(8000) == 8000


def test_empty_defaults_leave_sampling_params_as_the_engine_defines_them() -> None:
    given = {"temperature": None, "top_p": None}
    filled = GenerationDefaults().fill(given)
    params = SamplingParams(**{k: v for k, v in filled.items() if v is not None})
    assert params == SamplingParams()
