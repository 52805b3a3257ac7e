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


def test_an_open_loop_run_sends_at_the_rate_and_times_first_tokens(tmp_path) -> None:
    out = tmp_path / "result.json"
    argv = ["--duration", "2", "--request-rate", "40", "--client-procs", "2", "--workers", "1"]
    argv += ["--step-ms", "0", "--max-tokens", "1", "--json-out", str(out)]
    assert router_throughput.main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["errors"] == 0
    # Poisson arrivals at 40/s for 2 s: ~80 requests (p < 1e-6 outside 40-130 in all)
    assert 40 <= doc["requests_per_s"] * doc["wall_s"] <= 130
    assert 0 < doc["ttft_ms_p50"] <= doc["ttft_ms_p99"] < 2000
    # the fronts' own share, from their /metrics: part of what the clients measured
    assert 0 < doc["front_ttft_ms_mean"] < doc["ttft_ms_mean"]


@pytest.mark.parametrize("kind", ["asgi", "raw"])
def test_the_bare_http_floor_streams_every_token(tmp_path, kind) -> None:
    """Both bare fronts answer the same clients the same SSE shape (usage, one chunk per token)."""
    out = tmp_path / "bare.json"
    argv = ["--bare-http", kind, "--duration", "1.5", "--concurrency", "8", "--client-procs", "1"]
    assert router_throughput.main([*argv, "--max-tokens", "5", "--json-out", str(out)]) == 0
    bare = json.loads(out.read_text())
    assert bare["errors"] == 0 and bare["requests_per_s"] > 0
    assert bare["output_tokens_per_s"] == pytest.approx(5 * bare["requests_per_s"])
    assert bare["tokens_per_chunk"] == pytest.approx(1.0)  # one write per token, as the router's floor
    assert bare["worker_cpu_cores"] == 0  # no workers: what the front costs is HTTP and JSON alone
    assert bare["router_cpu_us_per_request"] > 0 and "front_ttft_ms_mean" not in bare  # no metrics
    # Paced at the default --step-ms 10: a request's 5 chunks span at least 3 whole steps (the ticks
    # are shared, so the first wait may be shorter), so 8 streams finish at most 8 / 0.03 s a second.
    assert bare["requests_per_s"] <= 8 / 0.030


def test_bad_arguments_are_refused() -> None:
    for bad in (
        ["--bare-http", "--api-servers", "2"],
        ["--bare-http", "h2"],
        ["--concurrency", "0"],
        ["--duration", "0"],
        ["--client-procs", "0"],
        ["--request-rate", "0"],
    ):
        with pytest.raises(SystemExit):
            router_throughput.parse_args(bad)


def test_two_fronts_on_one_port_share_the_streams(tmp_path) -> None:
    out = tmp_path / "result.json"
    argv = ["--duration", "2", "--concurrency", "16", "--client-procs", "2", "--workers", "2"]
    argv += ["--step-ms", "5", "--max-tokens", "20", "--token-batch", "--api-servers", "2"]
    assert router_throughput.main([*argv, "--json-out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["api_servers"] == 2 and doc["errors"] == 0
    assert doc["output_tokens_per_s"] == pytest.approx(20 * doc["requests_per_s"])
    # each front admitted streams and carried their tokens (its workers answered to its inbox)
    assert len(doc["router_cpu_cores_per_front"]) == 2 and min(doc["router_cpu_cores_per_front"]) > 0
    assert doc["worker_cpu_cores"] > 0 and doc["client_cpu_cores"] > 0


def test_a_sweep_reports_scaling_against_linear(capsys) -> None:
    rows = [
        {"api_servers": n, "output_tokens_per_s": tok, "requests_per_s": req, "router_cpu_cores": float(n)}
        | {"router_cpu_us_per_token": 1.0, "router_cpu_us_per_request": 1.0, "errors": 0}
        | {"worker_cpu_cores": 0.5, "client_cpu_cores": 0.5}
        for n, tok, req in ((1, 1000.0, 10.0), (2, 1500.0, 20.0))
    ]
    router_throughput.print_sweep(rows)
    last = capsys.readouterr().out.splitlines()[-1].split()
    assert last[0] == "2" and last[6:8] == ["0.75", "1.00"]  # tok/s 0.75 of linear, req/s linear


def test_front_counts_and_cpu_lists_are_parsed() -> None:
    a = router_throughput.parse_args(["--api-servers", "1,2,4", "--router-cpu", "0-2,5"])
    assert a.api_servers == [1, 2, 4] and a.router_cpu == [0, 1, 2, 5]
    for bad in (["--api-servers", "0"], ["--api-servers", "x"], ["--router-cpu", "a-b"]):
        with pytest.raises(SystemExit):
            router_throughput.parse_args(bad)
