"""The model's own sampling defaults, read from its `generation_config.json` (torch-free, for the router).

Model authors write the sampling settings their model is meant to run with into
`generation_config.json` (temperature, top_p, ...). As vLLM's `--generation-config auto|vllm|PATH`
does, a request that leaves a sampling field out gets the model's value, and a request's own value
always wins:

* `auto` reads `generation_config.json` from the model directory (no file: no defaults);
* `vllm` ignores the model's file: the defaults are the engine's own (temperature 1.0, ...);
* any other value is a directory whose `generation_config.json` is read (or that file itself; it
  must exist).

Only the fields below are taken, and only when the file sets them; `max_new_tokens` becomes the
server-wide cap of `max_tokens` (the default where a request gives none, and the limit where it gives
more). HF's `do_sample` is ignored, as vLLM ignores it: a file that sets a temperature means it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from common.wire.sampling_params import SamplingParams

GENERATION_CONFIG_FILE = "generation_config.json"
GENERATION_CONFIG_AUTO = "auto"
GENERATION_CONFIG_NONE = "vllm"
# HF generation_config.json key -> SamplingParams field.
SAMPLING_KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


@dataclass(frozen=True)
class GenerationDefaults:
    """Sampling values for requests that leave them out; None means "the engine's own default".

    Values are checked with SamplingParams' own rules, so a bad file fails at start-up with a
    ValueError naming the field, not on the first request.
    """

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    max_tokens: int | None = None  # generation_config.json's max_new_tokens: a cap, see `max_tokens_for`

    def __post_init__(self) -> None:
        SamplingParams(**self.as_dict())

    @classmethod
    def from_json(cls, data: object, source: str = GENERATION_CONFIG_FILE) -> GenerationDefaults:
        """Take the sampling keys `data` (a parsed generation_config.json) sets; ValueError names
        `source` and the field when a value is unusable."""
        if not isinstance(data, dict):
            raise ValueError(f"{source} must hold a JSON object, got {type(data).__name__}")
        found = {field: data[key] for key, field in SAMPLING_KEYS.items() if data.get(key) is not None}
        try:
            return cls(**found)
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None

    def as_dict(self) -> dict[str, Any]:
        """The fields that are set (what gets logged and applied)."""
        # Not dataclasses.asdict, whose deep copy cost more than the rest of a request's sampling
        # setup (this runs for every request); lists are still copied, so no caller shares ours.
        values = ((f.name, getattr(self, f.name)) for f in fields(self))
        return {k: list(v) if isinstance(v, list) else v for k, v in values if v is not None}

    def fill(self, given: dict[str, Any]) -> dict[str, Any]:
        """`given` (request values, None where the request left the field out) with the model's
        values in the gaps. `max_tokens` is not filled here: it is `max_tokens_for`'s."""
        filled = dict(given)
        for name, value in self.as_dict().items():
            if name != "max_tokens" and filled.get(name) is None:
                filled[name] = value
        return filled

    def max_tokens_for(self, max_tokens: int) -> int:
        """The request's `max_tokens` (its own, or the endpoint's default) within the model's cap."""
        return max_tokens if self.max_tokens is None else min(max_tokens, self.max_tokens)


def load_generation_defaults(choice: str, model_dir: str | Path) -> GenerationDefaults:
    """Resolve `--generation-config` (`auto`, `vllm` or a directory) for the model in `model_dir`."""
    if choice == GENERATION_CONFIG_NONE:
        return GenerationDefaults()
    if choice == GENERATION_CONFIG_AUTO:
        path = Path(model_dir) / GENERATION_CONFIG_FILE
        return _read(path) if path.is_file() else GenerationDefaults()
    path = Path(choice).expanduser()
    if path.is_dir():
        path = path / GENERATION_CONFIG_FILE
    if not path.is_file():
        raise ValueError(
            f"generation_config: {choice!r} is neither 'auto', 'vllm' nor a directory holding "
            f"{GENERATION_CONFIG_FILE}"
        )
    return _read(path)


def _read(path: Path) -> GenerationDefaults:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"generation_config: cannot read {path}: {e}") from None
    return GenerationDefaults.from_json(data, str(path))
