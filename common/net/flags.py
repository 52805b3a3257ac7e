"""Config fields as command-line flags: each flag is written once, in the table of the config it fills
(`ENGINE_FLAGS` for EngineConfig, `WORKER_FLAGS` for WorkerConfig, `ROUTER_FLAGS` for RouterConfig),
and every command line that offers it (the role's own, the launcher's) is built from that table.

A flag left out of a command line is absent from the parsed namespace (argparse.SUPPRESS), so `given`
returns exactly what the user typed and the config's own default stays the one default; `argv`
writes given values back as flags (how the launcher forwards them to the router and the workers).
Torch-free: the router builds its command line from here.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Flag:
    """One config field as a flag. `type` None makes a switch that sets the field to `switch_value`;
    `option` defaults to --field-name; `env` names a variable whose non-empty value stands in for a
    flag left out; `to_field` turns the parsed value into the field's (e.g. 0 seconds -> no limit)."""

    field: str
    type: Callable[[str], Any] | None = str
    help: str | None = None
    choices: tuple[str, ...] | None = None
    option: str | None = None
    required: bool = False
    switch_value: bool = True
    env: str | None = None
    to_field: Callable[[Any], Any] | None = None

    def __post_init__(self) -> None:
        if not self.field.isidentifier():
            raise ValueError(f"field must be an identifier, got {self.field!r}")
        if self.option is not None and not self.option.startswith("--"):
            raise ValueError(f"option must start with '--', got {self.option!r}")

    @property
    def name(self) -> str:
        """The option as users type it."""
        return self.option or "--" + self.field.replace("_", "-")

    @property
    def dest(self) -> str:
        """Where argparse keeps the value: from the option, so one option shared by two tables (the
        launcher's --served-model-name) is one value."""
        return self.name.removeprefix("--").replace("-", "_")

    def add_to(self, parser: argparse._ActionsContainer, help_prefix: str = "") -> None:
        shown = f"{help_prefix}{self.help}" if self.help else help_prefix.removesuffix(": ") or None
        common: dict[str, Any] = {"dest": self.dest, "default": argparse.SUPPRESS, "help": shown}
        if self.type is None:
            parser.add_argument(self.name, action="store_const", const=self.switch_value, **common)
        else:
            parser.add_argument(
                self.name, type=self.type, choices=self.choices, required=self.required, **common
            )

    def field_value(self, parsed: Any) -> Any:
        return parsed if self.to_field is None else self.to_field(parsed)

    def render(self, value: Any) -> list[str]:
        """The flags that give `value` back (a switch given its own value is written alone)."""
        if self.type is None:
            return [self.name] if value == self.switch_value else []
        return [self.name, str(value)]


class FlagTable:
    """The flags of one config (`name`, as error messages say it), in --help order; each field and each
    option once."""

    def __init__(self, name: str, flags: Iterable[Flag]) -> None:
        self.name = name
        self.flags = tuple(flags)
        for key in ("field", "name"):
            seen = [getattr(f, key) for f in self.flags]
            twice = sorted({k for k in seen if seen.count(k) > 1})
            if twice:
                raise ValueError(f"flags must name each {key} once; twice: {', '.join(twice)}")

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(f.field for f in self.flags)

    def __getitem__(self, field: str) -> Flag:
        for flag in self.flags:
            if flag.field == field:
                return flag
        raise KeyError(field)

    def only(self, fields: Iterable[str]) -> FlagTable:
        """The flags of `fields` (in table order); KeyError naming a field the table lacks."""
        wanted = set(fields)
        missing = wanted - set(self.fields)
        if missing:
            raise KeyError(f"not {self.name} flags: {', '.join(sorted(missing))}")
        return FlagTable(self.name, (f for f in self.flags if f.field in wanted))

    def without(self, fields: Iterable[str]) -> FlagTable:
        left_out = set(fields)
        self.only(left_out)  # checks the names
        return FlagTable(self.name, (f for f in self.flags if f.field not in left_out))

    def add_to(self, parser: argparse._ActionsContainer, help_prefix: str = "") -> None:
        for flag in self.flags:
            flag.add_to(parser, help_prefix)

    def given(self, args: argparse.Namespace) -> dict[str, Any]:
        """{field: parsed value} of the flags given (or standing in through their variable)."""
        values: dict[str, Any] = {}
        for flag in self.flags:
            if hasattr(args, flag.dest):
                values[flag.field] = getattr(args, flag.dest)
            elif flag.env and os.environ.get(flag.env):
                values[flag.field] = os.environ[flag.env]
        return values

    def config_values(self, args: argparse.Namespace) -> dict[str, Any]:
        """`given`, each value turned into its field's (`Flag.to_field`): keyword arguments of the config."""
        return {field: self[field].field_value(value) for field, value in self.given(args).items()}

    def argv(self, values: Mapping[str, Any]) -> list[str]:
        """Flags that reproduce `values` ({field: value}, None: not given), in table order."""
        unknown = set(values) - set(self.fields)
        if unknown:
            raise ValueError(f"not {self.name} flags: {', '.join(sorted(unknown))}")
        given = [f for f in self.flags if values.get(f.field) is not None]
        return [arg for flag in given for arg in flag.render(values[flag.field])]


LOG_LEVELS = ("debug", "info", "warning", "error")


def add_log_level(parser: argparse._ActionsContainer) -> None:
    """--log-level, which every process of the cluster takes (not a config field: logging is set up
    before any config exists)."""
    parser.add_argument("--log-level", default="info", choices=LOG_LEVELS)
