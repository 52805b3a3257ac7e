"""Structured output: what a request asks for (a JSON schema, any JSON object, a regex, a choice, a
grammar) turned into ONE llguidance grammar text, which is what `SamplingParams.grammar` carries.
Asked for by OpenAI's `response_format`, vLLM's `structured_outputs` object (its form since v0.12) or
vLLM's older `guided_*` fields.

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
    structured_outputs: dict[str, Any] | None = None

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


# vLLM's `structured_outputs`: exactly one constraint, each built as its guided_* field is ...
_CONSTRAINTS: dict[str, Callable[[Any, str], str]] = {
    "json": json_schema_grammar,
    "regex": regex_grammar,
    "choice": choice_grammar,
    "grammar": lark_grammar,
    "json_object": lambda value, field: json_schema_grammar(ANY_OBJECT_SCHEMA, field),
}
# ... and options that leave the answer as computed here: JSON is always compact and strict (see the
# module's docstring), whatever these say; a backend fallback does not arise with one backend.
_OPTIONS = ("disable_any_whitespace", "disable_additional_properties", "disable_fallback")
# Options that would change the answer and are not implemented: refused when set.
_REFUSED = ("whitespace_pattern", "structural_tag")


def structured_outputs_grammar(params: dict[str, Any], field: str = "structured_outputs") -> str:
    """The grammar of vLLM's `structured_outputs` object (`json`, `regex`, `choice`, `grammar` or
    `json_object: true`, and its boolean options)."""
    if not isinstance(params, dict):
        raise ValueError(f"{field} must be an object")
    for key, value in params.items():
        if key in _REFUSED and value is not None:
            raise ValueError(f"{field}.{key} is not supported")
        if key in _OPTIONS and value is not None and not isinstance(value, bool):
            raise ValueError(f"{field}.{key} must be true or false, got {value!r}")
        if key not in _CONSTRAINTS and key not in _OPTIONS and key not in _REFUSED:
            raise ValueError(f"{field}.{key} is not a structured_outputs field")
    if params.get("json_object") not in (None, True, False):
        raise ValueError(f"{field}.json_object must be true or false, got {params['json_object']!r}")
    given = [k for k in _CONSTRAINTS if params.get(k) is not None and params.get(k) is not False]
    if not given:
        raise ValueError(f"{field} must set one of {', '.join(_CONSTRAINTS)}")
    if len(given) > 1:
        raise ValueError(f"{field} sets {given[0]} and {given[1]}: ask for one output format")
    return _CONSTRAINTS[given[0]](params[given[0]], f"{field}.{given[0]}")


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
    "structured_outputs": structured_outputs_grammar,
}
_FIELDS = tuple(_BUILDERS)
