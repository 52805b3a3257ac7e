"""What bounds the offline standard workload: its floors at a copy rate and a GEMM rate, against a target.

    python benchmarks/engine/offline_budget.py                       # Qwen3-0.6B shape, 30,000 tok/s
    python benchmarks/engine/offline_budget.py --preset qwen3-8b --copy-tb-s 4.28 --gemm-tflops 778
    python benchmarks/engine/offline_budget.py --profile offprof.json   # set a measured profile against it

No GPU: the workload is `benchmarks/engine/offline.py`'s (same seed and lengths), the model shape a
`common/tools/random_model.py` preset, and the rates are arguments (defaults: the H200's copy and
bf16 GEMM rates measured by `benchmarks/engine/floors.py`, docs/benchmarks.md). Two floors:
- decode attention reads each sequence's whole KV once per generated token after the first: the
  sum over sequences of (prompt + t) cached tokens for t = 1 .. n-1, times the KV bytes per token;
- the projections compute 2 x their weights' elements FLOPs per input token (prompt tokens and every
  generated token but the last), the LM head once per generated token.
The target's wall time (output tokens / target) less the attention floor is what every other kernel,
and the host, may take. With `--profile` (the JSON of `offline_profile.py --json-out`) the measured
families are set against that remainder.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.engine.offline import add_workload_args, make_workload, parse_workload_args  # noqa: E402
from common.model_config import ModelConfig  # noqa: E402
from common.tools.random_model import PRESETS, tensor_shapes  # noqa: E402

# The H200's rates as floors.py measured them (docs/benchmarks.md, "8B-class shapes").
H200_COPY_TB_S = 4.28
H200_GEMM_TFLOPS = 778.0
KV_BYTES_PER_ELEMENT = 2  # the bf16 cache


@dataclass(frozen=True)
class ModelCosts:
    """Per-token costs of one model shape: KV bytes a cached token holds, the projections' weight
    elements (no embedding table, no head) and the head's."""

    kv_bytes_per_token: int
    linear_elements: int
    head_elements: int

    @classmethod
    def of_preset(cls, name: str) -> ModelCosts:
        if name not in PRESETS:
            raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {name!r}")
        cfg = PRESETS[name]
        model = ModelConfig.from_dict(cfg)  # the one reading of head_dim and the KV heads
        kv = 2 * model.num_hidden_layers * model.num_key_value_heads * model.head_dim * KV_BYTES_PER_ELEMENT
        shapes = tensor_shapes(cfg)
        linear = sum(
            shape[0] * shape[1]
            for tensor, shape in shapes.items()
            if len(shape) == 2 and "embed_tokens" not in tensor and "lm_head" not in tensor
        )
        return cls(kv, linear, model.vocab_size * model.hidden_size)


@dataclass(frozen=True)
class WorkloadCounts:
    prompt_tokens: int
    output_tokens: int
    kv_token_reads: int  # cached tokens read by decode attention, over every decode step
    projected_tokens: int  # tokens that pass through the projections

    @classmethod
    def of(cls, prompt_lens: list[int], output_lens: list[int]) -> WorkloadCounts:
        if len(prompt_lens) != len(output_lens):
            raise ValueError("prompt_lens and output_lens must be as long as each other")
        reads = sum((n - 1) * p + n * (n - 1) // 2 for p, n in zip(prompt_lens, output_lens, strict=True))
        prompts, outputs = sum(prompt_lens), sum(output_lens)
        return cls(prompts, outputs, reads, prompts + outputs - len(output_lens))


@dataclass(frozen=True)
class Budget:
    wall_s: float  # the target's wall time for the workload
    attention_floor_s: float
    gemm_floor_s: float
    kv_tb: float
    gemm_tflop: float

    @property
    def rest_s(self) -> float:
        """What all but decode attention (at its floor) may take: other kernels, GPU idle, the host."""
        return self.wall_s - self.attention_floor_s


def budget(
    costs: ModelCosts, counts: WorkloadCounts, target_tok_s: float, copy_tb_s: float, gemm_tflops: float
) -> Budget:
    for name, value in (("target", target_tok_s), ("copy_tb_s", copy_tb_s), ("gemm_tflops", gemm_tflops)):
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value}")
    kv_bytes = counts.kv_token_reads * costs.kv_bytes_per_token
    flops = 2 * (costs.linear_elements * counts.projected_tokens + costs.head_elements * counts.output_tokens)
    return Budget(
        wall_s=counts.output_tokens / target_tok_s,
        attention_floor_s=kv_bytes / (copy_tb_s * 1e12),
        gemm_floor_s=flops / (gemm_tflops * 1e12),
        kv_tb=kv_bytes / 1e12,
        gemm_tflop=flops / 1e12,
    )


def report(counts: WorkloadCounts, b: Budget, target: float, profile: dict | None) -> list[str]:
    lines = [
        f"workload: {counts.prompt_tokens:,} prompt tokens, {counts.output_tokens:,} output tokens",
        f"target {target:,.0f} tok/s: {b.wall_s:.3f} s of wall time",
        f"decode attention floor: {b.kv_tb:.2f} TB of KV read, {b.attention_floor_s:.3f} s "
        f"({b.attention_floor_s / b.wall_s:.0%} of the target's time)",
        f"projection floor: {b.gemm_tflop:.1f} TFLOP, {b.gemm_floor_s:.3f} s",
        f"left for everything but decode attention at its floor: {b.rest_s:.3f} s",
    ]
    if profile is not None:
        families = profile.get("families_s", {})
        attention = families.get("decode attention", 0.0)
        rest = profile["wall_s"] - attention
        lines += [
            f"profile: wall {profile['wall_s']:.3f} s, decode attention {attention:.3f} s "
            f"({attention / b.attention_floor_s:.2f}x its floor), the rest {rest:.3f} s "
            f"({rest / b.rest_s:.2f}x what the target leaves it)",
        ]
    return lines


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="qwen3-0.6b", choices=sorted(PRESETS))
    add_workload_args(p)
    p.add_argument("--target", type=float, default=30_000.0, help="output tokens per second")
    p.add_argument("--copy-tb-s", type=float, default=H200_COPY_TB_S)
    p.add_argument("--gemm-tflops", type=float, default=H200_GEMM_TFLOPS)
    p.add_argument("--profile", default=None, help="offline_profile.py --json-out file")
    a = parse_workload_args(p, argv)
    prompts, outputs = make_workload(a)
    counts = WorkloadCounts.of([len(x) for x in prompts], outputs)
    b = budget(ModelCosts.of_preset(a.preset), counts, a.target, a.copy_tb_s, a.gemm_tflops)
    profile = json.loads(Path(a.profile).read_text()) if a.profile else None
    print("\n".join(report(counts, b, a.target, profile)))


if __name__ == "__main__":
    main()
