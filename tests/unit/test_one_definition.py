"""Shared concepts are defined once: a second top-level definition of one of these names anywhere in
the source packages is a copy that will drift (three copies of WILDCARD_HOSTS once had three values)."""

from __future__ import annotations

import ast
from functools import cache

import pytest

from tests.unit.test_import_contracts import PACKAGES, ROOT

SHARED = {
    "WILDCARD_HOSTS": "common/net/addresses.py",
    "Waker": "common/net/waker.py",
    "ROLES": "common/wire/roles.py",
    "Role": "common/wire/roles.py",
    "FinishReason": "common/wire/sampling_params.py",
    "TokenLogprob": "common/wire/logprobs.py",
    "KVEvent": "common/wire/kv_events.py",
    "MessageError": "common/wire/wire_fields.py",
}


@cache
def top_level_definitions() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.parse(path.read_text()).body:
                for name in _defined(node):
                    found.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return found


def _defined(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


@pytest.mark.parametrize("name", sorted(SHARED))
def test_shared_concept_has_one_definition(name: str) -> None:
    assert top_level_definitions().get(name) == [SHARED[name]]
