"""EngineConfig fields as command-line flags, shared by the worker CLIs and the launcher.

Every flag defaults to None ("not given"), so `engine_config_from_args` leaves EngineConfig's own
defaults in charge and `engine_argv` can forward exactly what the user typed (the launcher passes its
engine flags on to every worker this way). `--model` is not one of these flags: each CLI owns it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from common.config import ATTENTION_BACKENDS, DEVICES, DTYPES, EngineConfig


@dataclass(frozen=True)
class EngineFlag:
    """One flag: its EngineConfig field, value type (None: a switch) and help text."""

    field: str
    type: type | None
    help: str
    choices: tuple[str, ...] | None = None
    switch_value: bool = True  # what the field becomes when a switch is given

    @property
    def option(self) -> str:
        if self.type is None and not self.switch_value:
            return "--no-" + self.field.removeprefix("enable_").replace("_", "-")
        return "--" + self.field.replace("_", "-")


ENGINE_FLAGS: tuple[EngineFlag, ...] = (
    EngineFlag("max_num_seqs", int, "most sequences running at once"),
    EngineFlag("max_num_batched_tokens", int, "token budget per engine step"),
    EngineFlag("max_model_len", int, "longest prompt + answer (default: the model's limit)"),
    EngineFlag("kvcache_block_size", int, "tokens per KV block (power of two)"),
    EngineFlag("num_kvcache_blocks", int, "fixed number of KV blocks (default: from memory)"),
    EngineFlag("cpu_kvcache_gb", float, "KV cache size on the CPU, GiB"),
    EngineFlag("gpu_memory_utilization", float, "share of the GPU this engine may use"),
    EngineFlag("enforce_eager", None, "disable CUDA graphs"),
    EngineFlag("device", str, "device", DEVICES),
    EngineFlag("dtype", str, "weight and KV dtype", DTYPES),
    EngineFlag("attention_backend", str, "attention implementation", ATTENTION_BACKENDS),
    EngineFlag("enable_prefix_caching", None, "disable the prefix cache", switch_value=False),
    EngineFlag("seed", int, "random seed for sampling"),
    EngineFlag("tensor_parallel_size", int, "GPUs per model replica"),
    EngineFlag("speculative", str, "speculative decoding method (decode steps)", ("ngram", "draft")),
    EngineFlag("draft_model", str, "draft model directory (same vocabulary) for --speculative draft"),
    EngineFlag("num_speculative_tokens", int, "most proposals verified per speculative step"),
    EngineFlag("speculative_max_batch", int, "CPU: no speculation while more sequences than this run"),
)


def add_engine_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add every ENGINE_FLAGS option to `parser` (in an 'engine' group); returns the parser."""
    group = parser.add_argument_group("engine")
    for flag in ENGINE_FLAGS:
        if flag.type is None:
            group.add_argument(
                flag.option, dest=flag.field, action="store_const", const=flag.switch_value, help=flag.help
            )
        else:
            group.add_argument(
                flag.option, dest=flag.field, type=flag.type, choices=flag.choices, help=flag.help
            )
    return parser


def engine_overrides(args: argparse.Namespace) -> dict:
    """The engine fields the user set explicitly (flags left out are absent)."""
    return {f.field: getattr(args, f.field) for f in ENGINE_FLAGS if getattr(args, f.field, None) is not None}


def engine_config_from_args(args: argparse.Namespace, role: str) -> EngineConfig:
    """EngineConfig for `role` from parsed flags plus `args.model`; raises ValueError naming the field."""
    return EngineConfig(model=args.model, role=role, **engine_overrides(args))


def engine_argv(overrides: dict) -> list[str]:
    """Command-line flags that reproduce `overrides` (a dict of engine fields), in ENGINE_FLAGS order."""
    unknown = set(overrides) - {f.field for f in ENGINE_FLAGS}
    if unknown:
        raise ValueError(f"not engine flags: {', '.join(sorted(unknown))}")
    argv: list[str] = []
    for flag in ENGINE_FLAGS:
        value = overrides.get(flag.field)
        if value is None:
            continue
        if flag.type is None:
            if value == flag.switch_value:
                argv.append(flag.option)
        else:
            argv += [flag.option, str(value)]
    return argv
