"""The offline workload's floors (benchmarks/engine/offline_budget.py) against counts made the long way
and a transformers model of the same preset."""

from __future__ import annotations

import argparse
import random

import pytest
import torch

from benchmarks.engine import offline_budget
from benchmarks.engine.offline import add_workload_args, make_workload, parse_workload_args
from benchmarks.engine.offline_budget import ModelCosts, WorkloadCounts, budget
from common.tools.random_model import PRESETS


def test_kv_reads_count_every_decode_step_s_context() -> None:
    rng = random.Random(5)
    prompts = [rng.randint(1, 40) for _ in range(30)]
    outputs = [rng.randint(1, 25) for _ in range(30)]
    counts = WorkloadCounts.of(prompts, outputs)
    # The first token comes from the prefill; the step that makes token t + 1 attends to p + t tokens.
    assert counts.kv_token_reads == sum(
        p + t for p, n in zip(prompts, outputs, strict=True) for t in range(1, n)
    )
    assert counts.projected_tokens == sum(prompts) + sum(n - 1 for n in outputs)
    assert (counts.prompt_tokens, counts.output_tokens) == (sum(prompts), sum(outputs))


@pytest.mark.parametrize("preset", ["qwen3-0.6b", "qwen3-8b"])
def test_model_costs_match_the_transformers_model(preset: str) -> None:
    transformers = pytest.importorskip("transformers")
    cfg = {k: v for k, v in PRESETS[preset].items() if k not in ("architectures",)}
    config = transformers.AutoConfig.for_model(**cfg)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    linears = [m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and name != "lm_head"]
    costs = ModelCosts.of_preset(preset)
    assert costs.linear_elements == sum(m.weight.numel() for m in linears)
    assert costs.head_elements == model.get_output_embeddings().weight.numel()
    layers, kv_heads = config.num_hidden_layers, config.num_key_value_heads
    assert costs.kv_bytes_per_token == layers * 2 * kv_heads * config.head_dim * 2  # K and V in bf16


def test_the_budget_divides_the_floors_by_the_rates() -> None:
    costs = ModelCosts(kv_bytes_per_token=1000, linear_elements=10, head_elements=4)
    counts = WorkloadCounts.of([3, 5], [2, 4])
    b = budget(costs, counts, target_tok_s=2.0, copy_tb_s=1e-9, gemm_tflops=1e-9)
    assert b.wall_s == 3.0  # 6 output tokens at 2 a second
    assert b.attention_floor_s == pytest.approx(counts.kv_token_reads * 1000 / 1e3)
    assert b.gemm_floor_s == pytest.approx(2 * (10 * counts.projected_tokens + 4 * 6) / 1e3)
    assert b.rest_s == pytest.approx(b.wall_s - b.attention_floor_s)


@pytest.mark.parametrize("field", ["target", "copy_tb_s", "gemm_tflops"])
def test_a_rate_that_is_not_positive_is_refused_by_name(field: str) -> None:
    rates = {"target_tok_s": 1.0, "copy_tb_s": 1.0, "gemm_tflops": 1.0}
    rates["target_tok_s" if field == "target" else field] = 0.0
    counts = WorkloadCounts.of([1], [2])
    with pytest.raises(ValueError, match=field):
        budget(ModelCosts(1, 1, 1), counts, **rates)


def test_an_unknown_preset_is_refused() -> None:
    with pytest.raises(ValueError, match="preset"):
        ModelCosts.of_preset("gpt-5")


def test_the_workload_arguments_build_offline_py_s_workload() -> None:
    p = argparse.ArgumentParser()
    add_workload_args(p)
    args = parse_workload_args(p, ["--num-seqs", "4", "--input-len", "5", "9", "--output-len", "3", "6"])
    prompts, outputs = make_workload(args)
    assert len(prompts) == 4 and all(5 <= len(x) <= 9 for x in prompts)
    assert all(3 <= n <= 6 for n in outputs)
    with pytest.raises(SystemExit):  # the served set has fixed lengths
        parse_workload_args(p, ["--served-set", "--input-len", "5", "9"])


def test_the_report_sets_a_profile_against_the_floors(tmp_path, capsys) -> None:
    profile = tmp_path / "prof.json"
    profile.write_text('{"wall_s": 6.0, "families_s": {"decode attention": 4.0}}')
    offline_budget.main(["--num-seqs", "8", "--profile", str(profile), "--target", "1000"])
    out = capsys.readouterr().out
    assert "decode attention floor:" in out and "projection floor:" in out
    assert "profile: wall 6.000 s, decode attention 4.000 s" in out
