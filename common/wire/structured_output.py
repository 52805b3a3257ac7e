"""Structured output: what a request asks for (a JSON schema, any JSON object, a regex, a choice, a
grammar) turned into ONE llguidance grammar text, which is what `SamplingParams.grammar` carries.

Torch-free (llguidance is a Rust extension without torch), so the router validates a request's schema
or regex before anything is dispatched and answers a 400 naming the field; the engine side builds
the token matcher from the same text (`common/runner/grammar.py`). Every error is a ValueError whose
message starts with the request field it is about (`router.errors.from_value_error` takes that word
as the OpenAI error's `param`).

JSON schemas compile strictly, as vLLM's default backend (xgrammar) and OpenAI's structured outputs
do: an object schema that lists `properties` and says nothing about `additionalProperties` allows
those properties only. JSON Schema's own reading (any further property of any value) lets a model
add fields until max_tokens; a schema that wants extras says so with `"additionalProperties"`, and a
request asks for the lenient reading of a whole schema with OpenAI's `"strict": false`
(`response_format.json_schema.strict`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llguidance import LLMatcher, grammar_from

# Compact JSON with the separators json.dumps writes. Flexible whitespace (llguidance's default) lets
# a small model emit newlines and spaces until max_tokens instead of closing the object.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}
# Keywords whose value is one subschema, a list of subschemas, or a name -> subschema map.
_SUBSCHEMA = (
    "additionalProperties",
    "unevaluatedProperties",
    "items",
    "additionalItems",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
)
_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


@dataclass(frozen=True)
class GuidedRequest:
    """The structured-output fields of one request, as the OpenAI API and vLLM's extras name them.
    At most one may be set."""

    response_format: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    def grammar(self) -> str | None:
        """The llguidance grammar text (validated), or None when the request asks for free text."""
        given = [name for name in _FIELDS if getattr(self, name) is not None]
        if self.response_format is not None and _format_type(self.response_format) == "text":
            given.remove("response_format")
        if not given:
            return None
        if len(given) > 1:
            raise ValueError(f"{given[1]} cannot be combined with {given[0]}: ask for one output format")
        field = given[0]
        return check_grammar(_BUILDERS[field](getattr(self, field), field), field)


def json_schema_grammar(schema: dict[str, Any] | str, field: str = "guided_json", strict: bool = True) -> str:
    """The grammar of a JSON schema; `strict` (the default) closes every object that lists its
    properties and does not say `additionalProperties` (see the module's docstring)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise ValueError(f"{field} is not valid JSON: {e}") from None
    if not isinstance(schema, dict):
        raise ValueError(f"{field} must be a JSON schema object, got {type(schema).__name__}")
    if strict:
        schema = closed_objects(schema)
    try:
        text = LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)  # type: ignore[arg-type]
    except (ValueError, TypeError) as e:
        raise ValueError(f"{field} is not a usable JSON schema: {e}") from None
    return check_grammar(text, field)


def regex_grammar(pattern: str, field: str = "guided_regex") -> str:
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"{field} must be a non-empty string")
    return check_grammar(LLMatcher.grammar_from_regex(pattern), field)


def choice_grammar(choices: list[str], field: str = "guided_choice") -> str:
    """One regex alternation of the escaped choices: the lexer takes any number of them, where a
    grammar rule of alternatives (llguidance's "choice" helper) fails past 2,000 at the first token
    that reaches the row, on the worker, after the answer has begun."""
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
        raise ValueError(f"{field} must be a non-empty list of non-empty strings")
    pattern = "(" + "|".join(_regex_literal(c) for c in choices) + ")"
    return check_grammar(LLMatcher.grammar_from_regex(pattern), field)


# The characters llguidance's (Rust) regex syntax gives a meaning; any other may not be escaped.
_REGEX_META = frozenset("\\.+*?()|[]{}^$#&-~")


def _regex_literal(text: str) -> str:
    return "".join("\\" + c if c in _REGEX_META else c for c in text)


def lark_grammar(text: str, field: str = "guided_grammar") -> str:
    """A Lark or GBNF grammar (llguidance accepts both)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{field} must be a non-empty grammar string")
    try:
        return check_grammar(grammar_from("grammar", text), field)
    except ValueError as e:
        raise ValueError(f"{field} is not a valid grammar: {e}") from None


def response_format_grammar(response_format: dict[str, Any], field: str = "response_format") -> str:
    kind = _format_type(response_format)
    if kind == "json_object":
        return json_schema_grammar(ANY_OBJECT_SCHEMA, field)
    if kind != "json_schema":
        raise ValueError(f"{field}.type must be 'text', 'json_object' or 'json_schema', got {kind!r}")
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict):
        raise ValueError(f"{field}.json_schema must be an object with a 'schema' (type json_schema)")
    schema = spec.get("schema")
    if schema is None:  # OpenAI's field is `schema`; some clients send the schema itself
        schema = {k: v for k, v in spec.items() if k not in ("name", "description", "strict")}
    if not schema:
        raise ValueError(f"{field}.json_schema.schema is required")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise ValueError(f"{field}.json_schema.strict must be true or false, got {strict!r}")
    return json_schema_grammar(schema, field, strict=strict is not False)


def closed_objects(schema: Any) -> Any:
    """A copy of `schema` in which every object schema with `properties` or `patternProperties` and
    no `additionalProperties` / `unevaluatedProperties` gets `"additionalProperties": false`."""
    if isinstance(schema, list):
        return [closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema  # true / false schemas, or a malformed one llguidance will name
    closed = dict(schema)
    for key in _SUBSCHEMA:
        if key in closed:
            closed[key] = closed_objects(closed[key])
    for key in _SUBSCHEMA_LISTS:
        if isinstance(closed.get(key), list):
            closed[key] = [closed_objects(s) for s in closed[key]]
    for key in _SUBSCHEMA_MAPS:
        if isinstance(closed.get(key), dict):
            closed[key] = {name: closed_objects(s) for name, s in closed[key].items()}
    lists_properties = "properties" in closed or "patternProperties" in closed
    if lists_properties and not {"additionalProperties", "unevaluatedProperties"} & closed.keys():
        closed["additionalProperties"] = False
    return closed


def check_grammar(text: str, field: str = "grammar") -> str:
    """The grammar text itself, once llguidance accepts it (no tokenizer needed)."""
    error = LLMatcher.validate_grammar(text)
    if error:
        raise ValueError(f"{field} is invalid: {error.strip()}")
    return text


def _format_type(response_format: dict[str, Any]) -> object:
    if not isinstance(response_format, dict):
        raise ValueError("response_format must be an object with a 'type'")
    return response_format.get("type", "text")


_BUILDERS: dict[str, Callable[[Any, str], str]] = {
    "response_format": response_format_grammar,
    "guided_json": json_schema_grammar,
    "guided_regex": regex_grammar,
    "guided_choice": choice_grammar,
    "guided_grammar": lark_grammar,
}
_FIELDS = tuple(_BUILDERS)
