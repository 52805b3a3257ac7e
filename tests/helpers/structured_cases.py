"""Structured-output cases shared by the offline and the cluster tests: a question, what the answer
must look like, and how to check an answer against it (jsonschema for schemas, a full regex match)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import jsonschema

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
COLORS = {
    "type": "array",
    "items": {"type": "string", "enum": ["red", "green", "blue", "yellow"]},
    "minItems": 1,
    "maxItems": 3,
}
CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "country": {"type": "string", "maxLength": 16},
        "capital": {"type": "boolean"},
        "landmarks": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 2},
        "size": {"enum": ["small", "medium", "large"]},
    },
    "required": ["city", "country", "capital", "landmarks", "size"],
    "additionalProperties": False,
}
ANY_OBJECT = {"type": "object"}  # what response_format {"type": "json_object"} promises


@dataclass(frozen=True)
class Case:
    question: str
    schema: dict[str, Any] | None = None  # a JSON answer validated against this schema
    regex: str | None = None  # else a text answer that must match this regex in full
    request: dict[str, Any] = field(default_factory=dict)  # the OpenAI/vLLM request fields

    def check(self, text: str) -> None:
        """Raise AssertionError (jsonschema's ValidationError is one) when `text` does not conform."""
        if self.schema is not None:
            jsonschema.validate(json.loads(text), self.schema)
        else:
            assert self.regex is not None and re.fullmatch(self.regex, text), f"{text!r} !~ {self.regex}"


def _schema_format(name: str, schema: dict) -> dict:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}}


CASES = [
    Case(
        "Describe a person as JSON with a name and an age.", PERSON, request=_schema_format("person", PERSON)
    ),
    Case("Name some colours of the rainbow as a JSON list.", COLORS, request={"guided_json": COLORS}),
    Case("Tell me about Paris as JSON.", CITY, request=_schema_format("city", CITY)),
    Case(
        'Answer as a JSON object like {"animal": "dog", "legs": 4}: a cat?',
        ANY_OBJECT,
        request={"response_format": {"type": "json_object"}},
    ),
    Case(
        "What is 12 times 12? Answer with digits.",
        regex=r"[0-9]{1,4}",
        request={"guided_regex": r"[0-9]{1,4}"},
    ),
    Case("Is the sky blue? Answer yes or no.", regex=r"yes|no", request={"guided_choice": ["yes", "no"]}),
    Case(  # vLLM's form since v0.12
        "How many legs does a spider have? Answer with digits.",
        regex=r"[0-9]{1,2}",
        request={"structured_outputs": {"regex": r"[0-9]{1,2}", "disable_any_whitespace": True}},
    ),
]
