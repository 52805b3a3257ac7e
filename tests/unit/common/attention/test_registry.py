"""Attention backend choice: every name offered is a backend that exists."""

from __future__ import annotations

import importlib.util

import pytest

from common.attention.registry import _BACKENDS, resolve_backend_name
from common.config import ATTENTION_BACKENDS, EngineConfig


def test_every_offered_backend_names_a_module_that_exists():
    assert set(ATTENTION_BACKENDS) == {"auto", *_BACKENDS}
    for target in _BACKENDS.values():
        module = target.partition(":")[0]
        assert importlib.util.find_spec(module) is not None, module


def test_the_cpu_resolves_to_torch_and_refuses_triton_by_name():
    assert resolve_backend_name("auto", "cpu") == "torch"
    assert resolve_backend_name("torch", "cpu") == "torch"
    with pytest.raises(ValueError, match="attention_backend 'triton' is not usable"):
        resolve_backend_name("triton", "cpu")


def test_an_unknown_backend_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="attention_backend"):
        EngineConfig(model="m", attention_backend="flash_attn")
