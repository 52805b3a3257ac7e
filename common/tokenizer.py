"""Tokenizer helpers for the engine side (the router has its own torch-free loader)."""

from __future__ import annotations

from pathlib import Path

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def has_tokenizer(model_dir: str | Path) -> bool:
    return any((Path(model_dir) / name).is_file() for name in _TOKENIZER_FILES)


def load_tokenizer(model_dir: str | Path):
    """The HF tokenizer of a model directory, or None when it ships none (e.g. random test models)."""
    if not has_tokenizer(model_dir):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))
