"""Open-loop serving benchmark against an OpenAI-compatible server (the pdserve router, vLLM, SGLang).

Requests arrive by a Poisson process (`--request-rate R`, or `inf`: all at once), optionally capped at
`--max-concurrency C` in flight; each is a streaming /v1/completions call with `ignore_eos` and
`max_tokens`, so every request produces exactly its output length.

    python benchmarks/serving/serving.py --base-url http://HOST:PORT/v1 --num-prompts 200 --request-rate 8 \
        --input-len 512 --output-len 128
    python benchmarks/serving/serving.py --base-url http://HOST:PORT/v1 --workload shared-prefix \
        --num-prefixes 4 --prefix-len 2048 --suffix-len 64 --max-concurrency 32 --json-out out.json

Metrics: TTFT = time to the first chunk with text; TPOT = (latency - TTFT) / (output tokens - 1);
ITL (inter-token latency) = every gap between two consecutive chunks with text, over all requests
(mean, p50, p99, max; as vLLM's, a chunk that carries several tokens is one gap), which shows the
stalls an average such as TPOT hides; the five longest gaps are listed with the Unix time each ended
(`itl_longest`), to be matched against the cluster's log lines;
output tokens and cached prompt tokens come from the final usage chunk (`stream_options.include_usage`,
`usage.prompt_tokens_details.cached_tokens`); throughputs divide by the wall time of the whole run;
goodput counts the requests meeting every SLO given (`--goodput-ttft-ms`, `--goodput-tpot-ms`, and
`--goodput-itl-ms`, which every gap between two streamed chunks of a request must meet).
Against a pdserve router the run's per-stage breakdown (`pdserve_stage_seconds` from /metrics, scraped
before and after) is printed too. `--client-procs N` spreads the requests over N client processes,
so the client never limits a fast server (one process parses roughly 20-40k chunks/s).
`--max-concurrency 1,4,16,64,256` sweeps: one run per value, the JSON then holds a `sweep` list of
runs. `--plot PATH` draws the TTFT/TPOT distributions (and throughput against concurrency when
sweeping) into a PNG with benchmarks/serving/plots.py (needs matplotlib, the dev extra).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, fields, replace
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.serving.completion_client import send_request  # noqa: E402
from benchmarks.serving.serving_stats import (  # noqa: E402
    RequestResult,
    format_table,
    is_good,
    json_safe,
    per_request_ms,
    summarize,
)
from benchmarks.serving.stage_metrics import format_breakdown, scrape, stage_breakdown  # noqa: E402
from benchmarks.serving.workloads import (  # noqa: E402
    TOKEN_RANGE,
    WorkloadRequest,
    add_timed_args,
    arrival_offsets,
    random_workload,
    run_timed,
    shared_prefix_workload,
)

__all__ = [  # re-exported: the benchmark's one import for its callers and tests
    "RequestResult", "format_table", "is_good", "json_safe", "summarize",
    "TOKEN_RANGE", "WorkloadRequest", "arrival_offsets", "random_workload", "shared_prefix_workload",
]  # fmt: skip


@dataclass
class RunConfig:
    base_url: str
    model: str | None = None
    request_rate: float = math.inf
    max_concurrency: int | None = None
    temperature: float = 0.0
    seed: int = 0
    timeout_s: float = 600.0
    client_procs: int = 1

    def __post_init__(self) -> None:
        if (
            isinstance(self.client_procs, bool)
            or not isinstance(self.client_procs, int)
            or self.client_procs < 1
        ):
            raise ValueError(f"client_procs must be an int >= 1, got {self.client_procs!r}")
        if not self.request_rate > 0:
            raise ValueError(f"request_rate must be > 0 (or inf), got {self.request_rate}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")


async def run_benchmark(cfg: RunConfig, workload: list[WorkloadRequest]) -> tuple[list[RequestResult], float]:
    """Send the workload open-loop; returns per-request results (in workload order) and the wall time.

    With `client_procs` > 1 the requests are dealt round-robin to that many processes, which share
    one start time (so the arrival process is the same) and each cap their share of the concurrency.
    """
    model = cfg.model or await _first_model(cfg)
    offsets = arrival_offsets(len(workload), cfg.request_rate, cfg.seed)
    items = list(enumerate(zip(workload, offsets, strict=True)))
    if cfg.client_procs == 1:
        start = time.time()
        results, end = await _run_share(cfg, model, items, start, cfg.max_concurrency)
    else:
        start = time.time() + 1.0 + 0.2 * cfg.client_procs  # every process started and connected
        share_limit = -(-cfg.max_concurrency // cfg.client_procs) if cfg.max_concurrency else None
        loop = asyncio.get_running_loop()
        with ProcessPoolExecutor(cfg.client_procs, mp_context=multiprocessing.get_context("spawn")) as pool:
            shares = await asyncio.gather(
                *(
                    loop.run_in_executor(
                        pool, _share_main, cfg, model, items[i :: cfg.client_procs], start, share_limit
                    )
                    for i in range(cfg.client_procs)
                )
            )
        results = [r for share, _ in shares for r in share]
        end = max(e for _, e in shares)
    ordered = [r for _, r in sorted(results, key=lambda x: x[0])]
    return ordered, max(end - start, 1e-9)


async def _first_model(cfg: RunConfig) -> str:
    """The server's first (usually only) model."""
    async with aiohttp.ClientSession() as s, s.get(f"{cfg.base_url.rstrip('/')}/models") as resp:
        return (await resp.json())["data"][0]["id"]


def _share_main(cfg: RunConfig, model: str, items: list, start: float, limit: int | None):
    """One client process's share (a ProcessPoolExecutor task)."""
    return asyncio.run(_run_share(cfg, model, items, start, limit))


async def _run_share(
    cfg: RunConfig, model: str, items: list, start: float, limit: int | None
) -> tuple[list[tuple[int, RequestResult]], float]:
    url = f"{cfg.base_url.rstrip('/')}/completions"
    gate = asyncio.Semaphore(limit) if limit else None
    # limit=0: no connection-pool cap, so concurrency is set by the arrivals and --max-concurrency alone.
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=cfg.timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as s:

        async def one(i: int, req: WorkloadRequest, offset: float) -> tuple[int, RequestResult]:
            await asyncio.sleep(max(0.0, start + offset - time.time()))
            async with gate or contextlib.nullcontext():
                return i, await send_request(s, url, model, req, cfg.temperature)

        results = await asyncio.gather(*(one(i, r, o) for i, (r, o) in items))
        return list(results), time.time()


def build_workload(a: argparse.Namespace) -> list[WorkloadRequest]:
    if a.workload == "random":
        return random_workload(a.num_prompts, a.input_len, a.output_len, a.seed)
    return shared_prefix_workload(
        a.num_prompts, a.num_prefixes, a.prefix_len, a.suffix_len, a.output_len, a.seed
    )


def concurrency_list(text: str) -> list[int]:
    """`--max-concurrency`: one cap, or a comma list of caps to sweep (each an int >= 1, no repeats)."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ints >= 1 separated by commas, got {text!r}") from None
    if any(v < 1 for v in values) or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"expected distinct ints >= 1, got {text!r}")
    return values


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, RunConfig]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", required=True, help="the server's OpenAI base, e.g. http://HOST:PORT/v1")
    p.add_argument("--model", default=None, help="model name to send (default: the first of /models)")
    p.add_argument(
        "--workload", choices=["random", "shared-prefix", "interference", "multi-turn"], default="random"
    )
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--input-len", type=int, default=512, help="random workload: prompt length")
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--num-prefixes", type=int, default=4)
    p.add_argument("--prefix-len", type=int, default=1024)
    p.add_argument("--suffix-len", type=int, default=64)
    p.add_argument("--request-rate", type=float, default=math.inf, help="requests/s (Poisson) or inf")
    p.add_argument(
        "--max-concurrency", dest="concurrencies", type=concurrency_list, default=None, help="N or N1,N2,..."
    )
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", dest="timeout_s", type=float, default=600.0, help="seconds per request")
    p.add_argument("--goodput-ttft-ms", type=float, default=None)
    p.add_argument("--goodput-tpot-ms", type=float, default=None)
    p.add_argument("--goodput-itl-ms", type=float, default=None, help="SLO on every inter-token gap")
    p.add_argument("--client-procs", type=int, default=1, help="client processes sharing the requests")
    p.add_argument("--metrics-url", default=None, help="default: the base URL's /metrics (stage breakdown)")
    p.add_argument("--json-out", default=None)
    p.add_argument("--plot", default=None, help="PNG of the TTFT/TPOT distributions (and the sweep)")
    add_timed_args(p)
    a = p.parse_args(argv)
    if a.concurrencies and len(a.concurrencies) > 1 and a.workload in ("interference", "multi-turn"):
        p.error("--max-concurrency sweeps need a request-count workload (random, shared-prefix)")
    a.max_concurrency = a.concurrencies[0] if a.concurrencies else None
    for name in ("num_prompts", "input_len", "output_len", "num_prefixes", "prefix_len", "suffix_len"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    try:
        return a, RunConfig(**{f.name: getattr(a, f.name) for f in fields(RunConfig)})
    except ValueError as e:
        p.error(str(e))


async def _run_timed(a: argparse.Namespace, cfg: RunConfig) -> tuple[dict, float]:
    model = cfg.model or await _first_model(cfg)
    return await run_timed(a, cfg.base_url, model, send_request, WorkloadRequest)


def run_once(a: argparse.Namespace, cfg: RunConfig) -> dict:
    """One run at `cfg.max_concurrency`: prints its tables, returns its JSON document (less args)."""
    metrics_url = a.metrics_url or cfg.base_url.rstrip("/").removesuffix("/v1") + "/metrics"
    before = scrape(metrics_url)
    slo = (a.goodput_ttft_ms, a.goodput_tpot_ms, a.goodput_itl_ms)
    by_kind = {}
    if a.workload in ("interference", "multi-turn"):  # time-driven, one client process
        groups, duration = asyncio.run(_run_timed(a, cfg))
        results = groups.pop("all")
        by_kind = {k: summarize(v, duration, *slo) for k, v in groups.items()}
    else:
        results, duration = asyncio.run(run_benchmark(cfg, build_workload(a)))
    after = scrape(metrics_url) if before is not None else None
    summary = summarize(results, duration, *slo)
    print(f"== max_concurrency {cfg.max_concurrency} ==\n{format_table(summary)}")
    for kind, figures in by_kind.items():
        print(f"-- {kind} requests only --\n{format_table(figures)}")
    stages = stage_breakdown(before, after) if before is not None and after is not None else {}
    if stages:  # a pdserve router: where the time went, per stage
        print(format_breakdown(stages))
    errors = [r.error for r in results if not r.ok]
    if errors:
        print(f"first error: {errors[0]}", file=sys.stderr)
    return {
        "max_concurrency": cfg.max_concurrency,
        "summary": summary,
        "by_kind": by_kind,
        "stages": stages,
        "errors": errors[:20],
        "requests": per_request_ms(results),
    }


def main(argv: list[str] | None = None) -> int:
    a, cfg = parse_args(argv)
    runs = [run_once(a, replace(cfg, max_concurrency=c)) for c in a.concurrencies or [None]]
    doc = {"args": vars(a)} | (runs[0] if len(runs) == 1 else {"sweep": runs})
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(json_safe(doc), indent=2))
    if a.plot:
        from benchmarks.serving.plots import plot_docs  # matplotlib only when a picture is asked for

        plot_docs([(Path(a.json_out or "run").stem, doc)], a.plot)
    return 0 if all(r["summary"]["completed"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
