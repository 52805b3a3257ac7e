"""Per-request sampling parameters, validated with ValueError naming the field, and why a sequence stopped.

Torch-free: the router builds these, and wire messages carry them as typed values (`common.wire.messages`).
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field


class FinishReason(enum.StrEnum):
    """Why a sequence stopped. The values are what the wire and the OpenAI API carry (a StrEnum, so a
    reason equals its string)."""

    STOP = "stop"  # EOS, a stop token id, or a stop string (applied by the detokenizing layer)
    LENGTH = "length"  # max_tokens or max_model_len reached
    ABORT = "abort"


@dataclass
class SamplingParams:
    """How to pick each next token and when to stop.

    temperature 0 means greedy. top_k 0 or -1 disables top-k; top_p 1 and min_p 0 disable those.
    repetition_penalty follows the CTRL/HF definition (>1 discourages repeats of any prompt or output
    token); presence/frequency penalties follow OpenAI's (output tokens only). `logprobs` asks for
    the chosen token's log-probability plus that many top alternatives (0 = chosen token only).
    `grammar` is an llguidance grammar text (`common.wire.structured_output` builds it from a JSON schema,
    regex, choice list or grammar): every sampled token is one the grammar allows next.
    `logit_bias` is OpenAI's: token id -> a bias in [-100, 100] added to that token's logit before
    sampling (a dict, or (id, bias) pairs; kept as pairs sorted by id, since the wire's maps take
    string keys only). Like the penalties it shapes the sampled distribution, not the logprobs.
    `include_stop_str_in_output` (vLLM's) keeps the stop string that ended the text, and the text of a
    stop token id that ended it, in the output; by default both are cut (OpenAI's rule).
    `cache_salt` (vLLM's) names the request's prefix-cache namespace: its KV blocks are hashed from a
    root derived from it (`common.wire.hashing.salt_root`), so they are reused only by requests with the
    same salt (tenants cannot probe each other's cached prompts through timing). It does not sample.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_tokens: int = 16
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None
    n: int = 1
    grammar: str | None = None
    logit_bias: list[tuple[int, float]] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    cache_salt: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.logit_bias = _bias_pairs(self.logit_bias)
        _number("temperature", self.temperature, 0.0, 100.0)
        _number("top_p", self.top_p, 0.0, 1.0, low_open=True)
        _number("min_p", self.min_p, 0.0, 1.0)
        _number("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _number("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        _number("repetition_penalty", self.repetition_penalty, 0.0, 100.0, low_open=True)
        _integer("top_k", self.top_k, -1, None)
        _integer("max_tokens", self.max_tokens, 1, None)
        _integer("min_tokens", self.min_tokens, 0, None)
        _integer("n", self.n, 1, 128)
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        if self.logprobs is not None:
            _integer("logprobs", self.logprobs, 0, 20)
        if self.seed is not None:
            _integer("seed", self.seed, -(2**63), 2**64 - 1)  # what torch.Generator.manual_seed takes
        for flag in ("ignore_eos", "include_stop_str_in_output"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag} must be a bool, got {getattr(self, flag)!r}")
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError("stop must be a non-empty string or a list of non-empty strings")
        _check_stop_sizes(self.stop)
        if not isinstance(self.stop_token_ids, list):
            raise ValueError("stop_token_ids must be a list of ints")
        for t in self.stop_token_ids:
            _integer("stop_token_ids", t, 0, None)
        salt = self.cache_salt
        if salt is not None and (not isinstance(salt, str) or not 0 < len(salt) <= MAX_CACHE_SALT_CHARS):
            raise ValueError(
                f"cache_salt must be a non-empty string of at most {MAX_CACHE_SALT_CHARS} characters"
            )
        if self.grammar is not None and (not isinstance(self.grammar, str) or not self.grammar):
            raise ValueError("grammar must be a non-empty grammar text or None")
        if self.grammar is not None and self.min_tokens:
            # The grammar decides where the output ends (only EOS once it is complete); banning EOS
            # until min_tokens would leave no token to sample.
            raise ValueError(
                "min_tokens cannot be combined with structured output (the grammar ends the output)"
            )

    def visible_tokens(self, tokens: list[int], finish: FinishReason | str | None) -> list[int]:
        """The tokens whose text is output: all but a stop token id that ended them (vLLM's rule),
        unless include_stop_str_in_output (the router's and the offline LLM's one rule)."""
        ended_by_stop_token = finish == FinishReason.STOP and tokens and tokens[-1] in self.stop_token_ids
        if ended_by_stop_token and not self.include_stop_str_in_output:
            return tokens[:-1]
        return tokens

    @property
    def greedy(self) -> bool:
        """Temperature 0: every token is the argmax (the one "is greedy" test of the project)."""
        return self.temperature == 0.0

    @property
    def reads_token_history(self) -> bool:
        """Sampling reads the tokens generated so far on the host at every step (penalties, logprobs),
        so run-ahead steps and speculative drafts cannot be used for this request. A grammar's mask
        for a token depends on the token before it, so it is one of them."""
        penalties = self.repetition_penalty != 1.0 or self.presence_penalty or self.frequency_penalty
        return self.logprobs is not None or bool(penalties) or self.grammar is not None

    @property
    def per_sequence(self) -> bool:
        """Sampling inputs that depend on the sequence, not only on these parameters: a seeded draw's
        generator, penalties' token counts, min_tokens' ban."""
        penalised = self.repetition_penalty != 1.0 or self.presence_penalty or self.frequency_penalty
        return (self.seed is not None and not self.greedy) or bool(penalised) or self.min_tokens > 0

    def batch_key(self) -> tuple | None:
        """What a batch row's sampling inputs depend on, as one shared object for equal values (so
        rows can be compared by identity); None when they also depend on the sequence. Requests that
        differ only in what sampling does not read (max_tokens, stop strings, ...) share a key."""
        if self.per_sequence or self.logit_bias:  # a bias is a per-row input the shared columns lack
            return None
        key = (self.temperature, self.top_k, self.top_p, self.min_p, self.logprobs)
        if len(_BATCH_KEYS) >= _MAX_BATCH_KEYS:  # bounded: clients choose these values freely
            _BATCH_KEYS.clear()
        return _BATCH_KEYS.setdefault(key, key)

    def to_dict(self) -> dict:
        """The field map (the same map a wire message carries for its `sampling` value)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> SamplingParams:
        return cls(**data)


# Stop strings are looked for in the streamed text by their prefixes (common/wire/detokenizer.py), whose
# table grows with the square of a string's length: unbounded, one request's stop string of a few
# hundred thousand characters held a router front for minutes. OpenAI takes at most 4 strings; these
# bounds leave room for every use we know of (the table then stays under ~3 MB and ~30 ms per request).
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 256
MAX_CACHE_SALT_CHARS = 1024  # a salt is hashed once per request; any tenant id or secret fits


def _check_stop_sizes(stop: list[str]) -> None:
    if len(stop) > MAX_STOP_STRINGS:
        raise ValueError(f"stop takes at most {MAX_STOP_STRINGS} strings, got {len(stop)}")
    longest = max(stop, key=len, default="")
    if len(longest) > MAX_STOP_CHARS:
        raise ValueError(
            f"stop strings must be at most {MAX_STOP_CHARS} characters, got one of {len(longest)}"
        )


MAX_LOGIT_BIAS = 100.0  # OpenAI's bound: -100 bans a token, +100 all but forces it


def _bias_pairs(value: object) -> list[tuple[int, float]]:
    """`logit_bias` as (token id, bias) pairs sorted by id, each checked."""
    if isinstance(value, dict):
        items: list | tuple = list(value.items())
    elif isinstance(value, list | tuple):
        items = value
    else:
        raise ValueError(f"logit_bias must map token ids to numbers, got {type(value).__name__}")
    pairs: list[tuple[int, float]] = []
    for item in items:
        if not isinstance(item, list | tuple) or len(item) != 2:
            raise ValueError(f"logit_bias must map token ids to numbers, got the item {item!r}")
        token, bias = item
        _integer("logit_bias token id", token, 0, None)
        _number(f"logit_bias of token {token}", bias, -MAX_LOGIT_BIAS, MAX_LOGIT_BIAS)
        pairs.append((token, float(bias)))
    pairs.sort()
    if any(a[0] == b[0] for a, b in zip(pairs, pairs[1:], strict=False)):
        raise ValueError("logit_bias names a token id twice")
    return pairs


# Interned batch keys (SamplingParams.batch_key): equal values, one object.
_BATCH_KEYS: dict[tuple, tuple] = {}
_MAX_BATCH_KEYS = 4096


def _number(name: str, value: object, low: float, high: float, low_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise ValueError(f"{name} must be a number, got {value!r}")
    if value > high or value < low or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise ValueError(f"{name} must be in {bracket}{low}, {high}], got {value!r}")


def _integer(name: str, value: object, low: int | None, high: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{name} must be {_integer_range(low, high)}, got {value!r}")


def _integer_range(low: int | None, high: int | None) -> str:
    """The allowed range as a person writes it: ">= 1", "<= 5", "in [1, 128]"."""
    if high is None:
        return f">= {low}"
    if low is None:
        return f"<= {high}"
    return f"in [{low}, {high}]"
