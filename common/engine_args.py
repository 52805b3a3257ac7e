"""EngineConfig fields as command-line flags (common/net/flags.py), shared by the worker CLIs and the
launcher.

A flag left out is absent ("not given"), so `engine_config_from_args` leaves EngineConfig's own
defaults in charge and `engine_argv` can forward exactly what the user typed (the launcher passes its
engine flags on to every worker this way). `--model` is not one of these flags: each CLI owns it.
"""

from __future__ import annotations

import argparse

from common.config import ATTENTION_BACKENDS, DEVICES, DTYPES, KV_CACHE_DTYPES, MUX_SPLITS, EngineConfig
from common.net.flags import Flag, FlagTable

ENGINE_FLAGS = FlagTable(
    "engine",
    (
        Flag("max_num_seqs", int, "most sequences running at once"),
        Flag("max_num_batched_tokens", int, "token budget per engine step"),
        Flag(
            "scheduler_delay_factor",
            float,
            "while a batch decodes, new prompts wait up to this times the last prompt step's duration",
        ),
        Flag("max_model_len", int, "longest prompt + answer (default: the model's limit)"),
        Flag("kvcache_block_size", int, "tokens per KV block (power of two)"),
        Flag("num_kvcache_blocks", int, "fixed number of KV blocks (default: from memory)"),
        Flag("cpu_kvcache_gb", float, "KV cache size on the CPU, GiB"),
        Flag("gpu_memory_utilization", float, "share of the GPU this engine may use"),
        Flag("enforce_eager", None, "disable CUDA graphs"),
        Flag("device", str, "device", DEVICES),
        Flag("dtype", str, "weight and KV dtype", DTYPES),
        Flag("attention_backend", str, "attention implementation", ATTENTION_BACKENDS),
        Flag(
            "kv_cache_dtype",
            str,
            "KV cache dtype: auto (the model dtype) or fp8 (float8_e4m3fn, per-token scales)",
            KV_CACHE_DTYPES,
        ),
        Flag(
            "enable_prefix_caching",
            None,
            "disable the prefix cache",
            option="--no-prefix-caching",
            switch_value=False,
        ),
        Flag("seed", int, "random seed for sampling"),
        Flag("tensor_parallel_size", int, "GPUs per model replica"),
        Flag("speculative", str, "speculative decoding method (decode steps)", ("ngram", "draft")),
        Flag("draft_model", str, "draft model directory (same vocabulary) for --speculative draft"),
        Flag("num_speculative_tokens", int, "most proposals verified per speculative step"),
        Flag("speculative_max_batch", int, "CPU: no speculation while more sequences than this run"),
        Flag("pd_multiplex", None, "mixed role: prefill beside decode on SM shares of one GPU"),
        Flag("itl_target_ms", float, "with --pd-multiplex: decode inter-token gap the SM split holds"),
        Flag(
            "itl_target_solo_ratio",
            float,
            "with --pd-multiplex: hold this multiple of the solo decode gap (at most --itl-target-ms;"
            " default 2; 0: --itl-target-ms alone)",
        ),
        Flag(
            "mux_split",
            str,
            "with --pd-multiplex: the SM split rule (knee: the largest share that does not slow decode;"
            " drain, with --itl-target-solo-ratio: --itl-target-ms itself while prefill is behind)",
            MUX_SPLITS,
        ),
        Flag(
            "mux_inline_prompt_tokens",
            int,
            "with --pd-multiplex: the longest uncached prompt run inside the decode step (a fixed limit,"
            " 0 = never; with --mux-inline-measured the measured budget's cap, 0 = 512)",
        ),
        Flag(
            "mux_inline_measured",
            None,
            "with --pd-multiplex: inline prompts up to a break-even measured against a chunk's host time",
        ),
    ),
)


def add_engine_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add every ENGINE_FLAGS option to `parser` (in an 'engine' group); returns the parser."""
    ENGINE_FLAGS.add_to(parser.add_argument_group("engine"))
    return parser


def engine_overrides(args: argparse.Namespace) -> dict:
    """The engine fields the user set explicitly (flags left out are absent)."""
    return ENGINE_FLAGS.given(args)


def engine_config_from_args(args: argparse.Namespace, role: str) -> EngineConfig:
    """EngineConfig for `role` from parsed flags plus `args.model`; raises ValueError naming the field."""
    return EngineConfig(model=args.model, role=role, **engine_overrides(args))


def engine_argv(overrides: dict) -> list[str]:
    """Command-line flags that reproduce `overrides` (a dict of engine fields), in ENGINE_FLAGS order."""
    return ENGINE_FLAGS.argv(overrides)
