"""The default model: prepared once into an HF directory, reused, resolvable, and it really answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.tools.chat import build_chat_prompt
from common.tools.default_model import (
    MARKER_FILE,
    MODEL_NAME,
    default_model_cache_dir,
    prepare_default_model,
    prepare_once,
    resolve_model,
)
from common.wire.generation_config import load_generation_defaults

REPO_ROOT = Path(__file__).resolve().parents[3]
IM_END_ID = 2  # `<|im_end|>` in SmolLM2's vocabulary


@pytest.fixture(scope="module")
def model_dir() -> Path:
    # Uses the real cache (normally already filled by scripts/setup.sh), so this is fast after the first run.
    return prepare_default_model(progress=False)


def _mtimes(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in directory.iterdir()}


def test_prepared_dir_is_an_hf_model(model_dir: Path) -> None:
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json"):
        assert (model_dir / name).is_file(), name
    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["tie_word_embeddings"] is True
    assert config["eos_token_id"] == IM_END_ID
    assert "quantization_config" not in config
    assert json.loads((model_dir / "generation_config.json").read_text())["eos_token_id"] == IM_END_ID
    tok_config = json.loads((model_dir / "tokenizer_config.json").read_text())
    assert tok_config["eos_token"] == "<|im_end|>"
    assert "<|im_start|>" in tok_config["chat_template"]


def test_prepared_model_carries_its_sampling_defaults(model_dir: Path) -> None:
    # What the router applies to requests that set no sampling (--generation-config auto): greedy,
    # the setting under which this copy answers the README's question correctly (see SAMPLING_DEFAULTS).
    defaults = load_generation_defaults("auto", model_dir)
    assert defaults.as_dict() == {"temperature": 0.0}
    assert json.loads((model_dir / "generation_config.json").read_text())["do_sample"] is False


def test_checkpoint_is_float32_with_tied_embeddings(model_dir: Path) -> None:
    from safetensors import safe_open

    with safe_open(model_dir / "model.safetensors", "pt") as f:
        names = list(f.keys())
        assert f.get_slice("model.embed_tokens.weight").get_dtype() == "F32"
        assert f.get_slice("model.embed_tokens.weight").get_shape() == [49152, 576]
    assert "lm_head.weight" not in names  # tied: the head reuses the embedding


def test_second_call_reuses_cache_without_rewriting(model_dir: Path) -> None:
    before = _mtimes(model_dir)
    start = time.monotonic()
    again = prepare_default_model(progress=False)
    assert time.monotonic() - start < 0.5
    assert again == model_dir
    assert _mtimes(model_dir) == before


def test_cli_prints_the_prepared_path(model_dir: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "common.tools.default_model"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert out.stdout.strip() == str(model_dir)


def test_cache_dir_follows_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path))
    assert default_model_cache_dir() == tmp_path / "models" / MODEL_NAME
    monkeypatch.delenv("PDSERVE_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_model_cache_dir() == tmp_path / "home" / ".cache" / "pdserve" / "models" / MODEL_NAME


def test_resolve_model_explicit_path_wins(model_dir: Path, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(ValueError, match="no-such-model"):
        resolve_model(str(missing))
    with pytest.raises(ValueError, match="config.json"):
        resolve_model(str(tmp_path))
    assert resolve_model(str(model_dir)) == str(model_dir)
    assert resolve_model(None) == str(model_dir)


_BUILD_ONCE = """
import sys, time
from pathlib import Path
from common.tools.default_model import prepare_once

target, log = Path(sys.argv[1]), Path(sys.argv[2])

def build(tmp):
    with open(log, "a") as f:
        f.write("built\\n")
    time.sleep(0.5)  # long enough that the other processes arrive while this one holds the lock
    (tmp / "weights.bin").write_bytes(b"x" * 1000)

print(prepare_once(target, build, progress=False))
"""


def test_prepare_once_builds_once_across_processes(tmp_path: Path) -> None:
    target, log = tmp_path / "models" / "m", tmp_path / "builds.log"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    cmd = [sys.executable, "-c", _BUILD_ONCE, str(target), str(log)]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) for _ in range(3)]
    outputs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0]
    assert outputs == [str(target)] * 3
    assert log.read_text() == "built\n"
    assert (target / "weights.bin").stat().st_size == 1000
    assert (target / MARKER_FILE).is_file()
    assert sorted(p.name for p in target.parent.iterdir()) == ["m", "m.lock"]  # no temp leftovers


def test_prepare_once_failed_build_publishes_nothing(tmp_path: Path) -> None:
    target = tmp_path / "m"

    def broken(tmp: Path) -> None:
        (tmp / "half.bin").write_bytes(b"x")
        raise RuntimeError("conversion failed")

    with pytest.raises(RuntimeError, match="conversion failed"):
        prepare_once(target, broken, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.lock"]


def test_prepare_once_rebuilds_old_format_but_never_deletes_foreign_dirs(tmp_path: Path) -> None:
    old = tmp_path / "old"
    old.mkdir()
    (old / MARKER_FILE).write_text(json.dumps({"format": 0}))
    prepare_once(old, lambda tmp: (tmp / "new.bin").write_bytes(b"1"), progress=False)
    assert (old / "new.bin").is_file()

    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "precious.txt").write_text("keep me")
    with pytest.raises(ValueError, match="not a pdserve-prepared model"):
        prepare_once(foreign, lambda tmp: None, progress=False)
    assert (foreign / "precious.txt").read_text() == "keep me"


def test_chat_template_formats_chatml(model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompt = build_chat_prompt(tokenizer, "Hi", system="Be brief.")
    expected = (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert prompt == expected
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.eos_token_id == IM_END_ID
    with pytest.raises(ValueError, match="empty"):
        build_chat_prompt(tokenizer, "  ")


def test_transformers_answers_capital_of_france(model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    prompt = build_chat_prompt(tokenizer, "What is the capital of France?")
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=16, do_sample=False)
    new = out[0, ids.shape[1] :].tolist()
    # Greedy fp32 answer is "The capital of France is Paris." followed by <|im_end|>, well within 16 tokens.
    assert new[-1] == IM_END_ID
    assert "Paris" in tokenizer.decode(new, skip_special_tokens=True)
