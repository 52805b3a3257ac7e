"""benchmarks/serving/router_throughput.py end to end: a real router process, firehose workers, client
processes."""

from __future__ import annotations

import json

import pytest

from benchmarks.serving import router_throughput


def test_a_short_run_carries_every_token(tmp_path) -> None:
    out = tmp_path / "result.json"
    argv = ["--duration", "1.5", "--concurrency", "8", "--client-procs", "2"]
    argv += ["--workers", "1", "--step-ms", "5", "--max-tokens", "20", "--json-out", str(out)]
    assert router_throughput.main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["errors"] == 0 and doc["requests_per_s"] > 0
    # every request's 20 tokens arrived (usage), in at most 20 chunks each
    assert doc["output_tokens_per_s"] == pytest.approx(20 * doc["requests_per_s"])
    assert doc["tokens_per_chunk"] >= 1.0 and doc["router_cpu_us_per_token"] > 0


def test_bad_arguments_are_refused() -> None:
    for bad in (["--concurrency", "0"], ["--duration", "0"], ["--client-procs", "0"]):
        with pytest.raises(SystemExit):
            router_throughput.parse_args(bad)
