"""The PDSERVE_* switches: defaults when unset, the values they accept, a ValueError naming the variable
for anything else (read through the engine's own readers where one exists)."""

from __future__ import annotations

import pytest

from common.attention import torch_contexts
from common.env_flags import env_choice, env_float, env_int, env_switch
from common.layers import cpu_packed, fused

NAME = "PDSERVE_TEST_FLAG"


def test_unset_gives_the_default(monkeypatch):
    monkeypatch.delenv(NAME, raising=False)
    assert env_choice(NAME, ("auto", "0"), "auto") == "auto"
    assert env_switch(NAME, default=True) is True and env_switch(NAME, default=False) is False
    assert env_int(NAME, 3, low=1, high=16) == 3
    assert env_float(NAME, 2.5) == 2.5


@pytest.mark.parametrize(("raw", "want"), [("1", True), ("0", False)])
def test_switch_values(monkeypatch, raw, want):
    monkeypatch.setenv(NAME, raw)
    assert env_switch(NAME, default=not want) is want


@pytest.mark.parametrize("raw", ["yes", "true", "", "2", " 1"])
def test_a_switch_refuses_anything_but_0_and_1(monkeypatch, raw):
    monkeypatch.setenv(NAME, raw)
    with pytest.raises(ValueError, match=f"{NAME} must be one of 0, 1"):
        env_switch(NAME, default=False)


@pytest.mark.parametrize("raw", ["0", "17", "four", "", "2.5"])
def test_int_range(monkeypatch, raw):
    monkeypatch.setenv(NAME, raw)
    with pytest.raises(ValueError, match=rf"{NAME} must be an integer in \[1, 16\]"):
        env_int(NAME, 1, low=1, high=16)


@pytest.mark.parametrize(
    ("raw", "allow_zero"), [("0", False), ("-1", True), ("inf", True), ("nan", True), ("x", False)]
)
def test_float_range(monkeypatch, raw, allow_zero):
    monkeypatch.setenv(NAME, raw)
    with pytest.raises(ValueError, match=f"{NAME} must be a finite number"):
        env_float(NAME, 1.0, allow_zero=allow_zero)
    monkeypatch.setenv(NAME, "0.5")
    assert env_float(NAME, 1.0, allow_zero=allow_zero) == 0.5


def test_the_engine_readers_refuse_a_typo(monkeypatch):
    monkeypatch.setenv("PDSERVE_CPU_CONTEXT_MB", "1GB")
    with pytest.raises(ValueError, match="PDSERVE_CPU_CONTEXT_MB"):
        torch_contexts.budget_bytes()
    monkeypatch.setenv("PDSERVE_CPU_CONTEXT_MB", "0")  # no kept contexts: allowed
    assert torch_contexts.budget_bytes() == 0
    for cached, name in [
        (cpu_packed._packing_usable, "PDSERVE_DISABLE_CPU_PACKING"),
        (fused._triton_usable, "PDSERVE_DISABLE_FUSED"),
    ]:
        cached.cache_clear()
        monkeypatch.setenv(name, "true")
        try:
            with pytest.raises(ValueError, match=name):
                cached()
        finally:
            monkeypatch.delenv(name)
            cached.cache_clear()
