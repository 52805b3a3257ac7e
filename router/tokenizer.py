"""The router's tokenizer: `tokenizers` + a jinja2 chat template, without transformers (so without torch).

Reads a Hugging Face model directory: tokenizer.json (required), tokenizer_config.json (special tokens
and `chat_template`), chat_template.jinja / chat_template.json (where newer transformers save the
template), generation_config.json and config.json (EOS ids). Chat templates are rendered the way
transformers' `apply_chat_template` does: a sandboxed jinja2 environment with trim_blocks,
lstrip_blocks, loop controls, `raise_exception`, `strftime_now`, a non-ASCII-escaping `tojson`, and the
special tokens (`bos_token`, `eos_token`, ...) as variables; the rendered text is then encoded without
adding special tokens again, as transformers does.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from common.wire.byte_level import ByteLevelTable

SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")


# The rendering arguments of their own (ModelTokenizer.apply_chat_template): extra template variables
# (a request's chat_template_kwargs) cannot take these names.
CHAT_TEMPLATE_ARGUMENTS = frozenset(
    {"messages", "add_generation_prompt", "continue_final_message", "documents"}
)


class ChatTemplateError(ValueError):
    """The chat template refused the conversation (raise_exception) or failed to render."""


class FinalMessageError(ValueError):
    """continue_final_message was asked for a conversation whose last message it cannot leave open."""


@dataclass(frozen=True)
class SpecialTokens:
    bos_token: str | None = None
    eos_token: str | None = None
    unk_token: str | None = None
    pad_token: str | None = None

    def as_template_vars(self) -> dict[str, str]:
        return {name: getattr(self, name) for name in SPECIAL_TOKEN_NAMES if getattr(self, name) is not None}


class ModelTokenizer:
    """Encode, decode and render chat prompts for one model. Build it with `from_dir`."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        special: SpecialTokens,
        chat_template: str | None,
        eos_token_ids: Sequence[int] = (),
    ) -> None:
        self.backend = tokenizer
        self.special = special
        self.chat_template = chat_template
        self.eos_token_ids = tuple(eos_token_ids)
        self._compiled: jinja2.Template | None = None  # compiled on first use

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelTokenizer:
        path = Path(model_dir)
        tokenizer_file = path / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {path}")
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
        config = _read_json(path / "tokenizer_config.json")
        special = SpecialTokens(**{name: _token_text(config.get(name)) for name in SPECIAL_TOKEN_NAMES})
        template = _find_chat_template(path, config)
        eos_ids = _eos_token_ids(path, tokenizer, special)
        return cls(tokenizer, special, template, eos_ids)

    @functools.cached_property
    def vocab_size(self) -> int:
        # Cached: every token-id prompt is checked against it, and asking the backend is a call into Rust.
        return self.backend.get_vocab_size(with_added_tokens=True)

    @functools.cached_property
    def max_token_chars(self) -> int:
        """An upper bound on the characters one token covers (vocabulary strings are byte-level or
        character-level, so their length bounds the text a token can stand for)."""
        return max((len(t) for t in self.backend.get_vocab(with_added_tokens=True)), default=1)

    @functools.cached_property
    def byte_table(self) -> ByteLevelTable | None:
        """Each id's bytes when the tokenizer is byte-level BPE and the table agrees with it (the
        detokenizer's fast path, common/wire/byte_level.py); else None."""
        return ByteLevelTable.from_tokenizer(self.backend)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        """One token's text for logprobs (a lone byte of a multi-byte character decodes to U+FFFD)."""
        return self.backend.decode([token_id], skip_special_tokens=False)

    def apply_chat_template(
        self,
        messages: Sequence[dict[str, Any]],
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        **kwargs: Any,
    ) -> str:
        """Render the conversation to prompt text, as transformers' apply_chat_template(tokenize=False)
        with the same arguments: `kwargs` are extra template variables, and `continue_final_message`
        ends the text right after the last message's content (no end-of-turn), for the model to go on
        with it."""
        if self.chat_template is None:
            raise ChatTemplateError("this model has no chat template; use /v1/completions")
        if self._compiled is None:
            self._compiled = _compile(self.chat_template)
        variables = {"tools": None, "documents": None, **self.special.as_template_vars(), **kwargs}
        try:
            text = self._compiled.render(
                messages=list(messages), add_generation_prompt=add_generation_prompt, **variables
            )
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"chat template error: {e}") from None
        return _open_final_message(text, messages) if continue_final_message else text

    def encode_chat(
        self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]:
        return self.encode(
            self.apply_chat_template(messages, add_generation_prompt), add_special_tokens=False
        )


def _open_final_message(text: str, messages: Sequence[dict[str, Any]]) -> str:
    """`text` cut right after the last message's content (where the template rendered it last); the
    content stripped of surrounding whitespace if the template stripped it."""
    final = messages[-1].get("content") if messages else None
    if not isinstance(final, str) or not final.strip():
        raise FinalMessageError("continue_final_message needs a last message with text to continue")
    for content in (final, final.strip()):
        end = text.rfind(content)
        if end >= 0:
            return text[: end + len(content)]
    raise FinalMessageError(
        "continue_final_message: the chat template does not render the last message's text"
    )


class _GenerationTracker(jinja2.ext.Extension):
    """Accepts transformers' `{% generation %}...{% endgeneration %}` markers and renders the body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> list[jinja2.nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys=False
):
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTracker, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"chat template does not compile: {e}") from None


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    with path.open(encoding="utf-8") as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str | None:
    """Special tokens are saved either as strings or as serialized AddedToken dicts."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _find_chat_template(path: Path, config: dict) -> str | None:
    jinja_file = path / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = _read_json(path / "chat_template.json").get("chat_template", config.get("chat_template"))
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _eos_token_ids(path: Path, tokenizer: Tokenizer, special: SpecialTokens) -> list[int]:
    ids: list[int] = []
    for source in ("generation_config.json", "config.json"):
        value = _read_json(path / source).get("eos_token_id")
        ids.extend(v for v in (value if isinstance(value, list) else [value]) if isinstance(v, int))
    if special.eos_token is not None:
        token_id = tokenizer.token_to_id(special.eos_token)
        if token_id is not None:
            ids.append(token_id)
    return sorted(set(ids))
