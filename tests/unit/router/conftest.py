"""Router test fixtures: the default model's tokenizer files (no model weights needed)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from router.tokenizer import ModelTokenizer

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja")


def _tokenizer_only_dir(target: Path) -> Path:
    """The default model's tokenizer, from the prepared cache when there is one, else from the GGUF.

    Converting only the tokenizer takes seconds, whereas preparing the full model dequantizes weights;
    router tests need nothing but tokenizer files.
    """
    from common.tools.default_model import default_model_cache_dir, gguf_path, is_prepared

    cached = default_model_cache_dir()
    target.mkdir(parents=True, exist_ok=True)
    if is_prepared(cached):
        for name in TOKENIZER_FILES:
            if (cached / name).is_file():
                shutil.copy(cached / name, target / name)
        return target
    from transformers import AutoTokenizer

    gguf = gguf_path()
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(str(target))
    (target / "generation_config.json").write_text('{"eos_token_id": 2}')
    return target


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    return _tokenizer_only_dir(tmp_path_factory.mktemp("router_model") / "SmolLM2-135M-Instruct")


@pytest.fixture(scope="session")
def tokenizer(model_dir: Path) -> ModelTokenizer:
    return ModelTokenizer.from_dir(model_dir)
