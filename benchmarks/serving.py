"""Open-loop serving benchmark against an OpenAI-compatible server (the pdserve router, vLLM, SGLang).

Requests arrive by a Poisson process (`--request-rate R`, or `inf`: all at once), optionally capped at
`--max-concurrency C` in flight; each is a streaming /v1/completions call with `ignore_eos` and
`max_tokens`, so every request produces exactly its output length.

    python benchmarks/serving.py --base-url http://HOST:PORT/v1 --num-prompts 200 --request-rate 8 \
        --input-len 512 --output-len 128
    python benchmarks/serving.py --base-url http://HOST:PORT/v1 --workload shared-prefix \
        --num-prefixes 4 --prefix-len 2048 --suffix-len 64 --max-concurrency 32 --json-out out.json

Metrics: TTFT = time to the first chunk with text; TPOT = (latency - TTFT) / (output tokens - 1);
output tokens and cached prompt tokens come from the final usage chunk (`stream_options.include_usage`,
`usage.prompt_tokens_details.cached_tokens`); throughputs divide by the wall time of the whole run;
goodput counts the requests meeting every SLO given (`--goodput-ttft-ms`, `--goodput-tpot-ms`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import random
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path

import aiohttp

# Prompts are token ids (the completions API takes them), so input lengths are exact whatever the
# tokenizer; drawn above the special tokens that vocabularies put first, below any real vocabulary size.
TOKEN_RANGE = (100, 10_000)


@dataclass(frozen=True)
class WorkloadRequest:
    prompt: list[int]
    max_tokens: int
    prefix_id: int | None = None  # which shared prefix (shared-prefix workload)


@dataclass
class RequestResult:
    latency_s: float = 0.0
    ttft_s: float | None = None
    output_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    error: str = ""  # empty: the request succeeded

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def tpot_s(self) -> float | None:
        if not self.ok or self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)


def _prompt(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(*TOKEN_RANGE) for _ in range(length)]


def random_workload(num: int, input_len: int, output_len: int, seed: int) -> list[WorkloadRequest]:
    rng = random.Random(seed)
    return [WorkloadRequest(_prompt(rng, input_len), output_len) for _ in range(num)]


def shared_prefix_workload(
    num: int, num_prefixes: int, prefix_len: int, suffix_len: int, output_len: int, seed: int
) -> list[WorkloadRequest]:
    """`num` requests over `num_prefixes` long prefixes, each used about equally, in random order."""
    rng = random.Random(seed)
    prefixes = [_prompt(rng, prefix_len) for _ in range(num_prefixes)]
    ids = [i % num_prefixes for i in range(num)]
    rng.shuffle(ids)
    return [WorkloadRequest(prefixes[i] + _prompt(rng, suffix_len), output_len, i) for i in ids]


def arrival_offsets(num: int, rate: float, seed: int) -> list[float]:
    """Seconds from the start at which each request is sent: a Poisson process, or all at 0."""
    if math.isinf(rate):
        return [0.0] * num
    rng = random.Random(seed)
    return list(itertools.accumulate((rng.expovariate(rate) for _ in range(num - 1)), initial=0.0))


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); NaN when there is nothing."""
    if not values:
        return math.nan
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def is_good(r: RequestResult, ttft_ms: float | None, tpot_ms: float | None) -> bool:
    if not r.ok or (ttft_ms is not None and (r.ttft_s is None or r.ttft_s * 1e3 > ttft_ms)):
        return False
    tpot = r.tpot_s  # None for one-token outputs: no inter-token time to miss the SLO with
    return tpot_ms is None or tpot is None or tpot * 1e3 <= tpot_ms


def _stats_ms(values_s: list[float]) -> dict:
    ms = [v * 1e3 for v in values_s]
    mean = sum(ms) / len(ms) if ms else math.nan
    return {"mean": mean, "p50": percentile(ms, 50), "p99": percentile(ms, 99)}


def summarize(results: list[RequestResult], duration_s: float, ttft_ms=None, tpot_ms=None) -> dict:
    ok = [r for r in results if r.ok]
    duration_s = max(duration_s, 1e-9)
    out_tokens = sum(r.output_tokens for r in ok)
    prompt_tokens = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    slo_given = ttft_ms is not None or tpot_ms is not None
    good = sum(is_good(r, ttft_ms, tpot_ms) for r in results)
    return {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration_s": duration_s,
        "request_throughput_per_s": len(ok) / duration_s,
        "output_tokens_per_s": out_tokens / duration_s,
        "total_prompt_tokens": prompt_tokens,
        "total_output_tokens": out_tokens,
        "total_cached_tokens": cached,
        "cached_token_ratio": cached / prompt_tokens if prompt_tokens else 0.0,
        "ttft_ms": _stats_ms([r.ttft_s for r in ok if r.ttft_s is not None]),
        "tpot_ms": _stats_ms([t for r in ok if (t := r.tpot_s) is not None]),
        "goodput_per_s": good / duration_s if slo_given else None,
        "goodput_slo": {"ttft_ms": ttft_ms, "tpot_ms": tpot_ms},
    }


# Fixed for every request: streamed, with a usage chunk at the end, and exactly max_tokens generated.
FIXED_FIELDS = {"ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}


async def send_request(session, url: str, model: str, req: WorkloadRequest, temperature: float):
    payload = FIXED_FIELDS | {"model": model, "prompt": req.prompt, "max_tokens": req.max_tokens}
    payload["temperature"] = temperature
    t0 = time.perf_counter()
    result = RequestResult()
    try:
        async with session.post(url, json=payload) as resp:
            if resp.status != 200:
                result.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return result
            usage = await _read_stream(resp, result, t0)
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:  # ValueError: bad JSON/UTF-8, huge line
        result.error = f"{type(e).__name__}: {e}"[:200]
        return result
    result.latency_s = time.perf_counter() - t0
    if usage is None:
        result.error = result.error or "the stream carried no usage chunk"
        return result
    result.output_tokens = usage.get("completion_tokens", 0)
    result.prompt_tokens = usage.get("prompt_tokens", 0)
    result.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return result


async def _read_stream(resp: aiohttp.ClientResponse, result: RequestResult, t0: float) -> dict | None:
    """Consume the SSE stream: TTFT into `result`; returns the usage (None after an error event)."""
    usage = None
    async for raw in resp.content:
        line = raw.decode("utf-8").strip()
        if not line.startswith("data:"):
            continue  # blank separators, SSE comments (keep-alives)
        if (data := line.removeprefix("data:").strip()) == "[DONE]":
            break
        chunk = json.loads(data)
        if "error" in chunk:
            result.error = str(chunk["error"])[:200]
            return None
        if result.ttft_s is None and any(c.get("text") for c in chunk.get("choices") or []):
            result.ttft_s = time.perf_counter() - t0
        usage = chunk.get("usage") or usage
    return usage


@dataclass
class RunConfig:
    base_url: str
    model: str | None = None
    request_rate: float = math.inf
    max_concurrency: int | None = None
    temperature: float = 0.0
    seed: int = 0
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if not self.request_rate > 0:
            raise ValueError(f"request_rate must be > 0 (or inf), got {self.request_rate}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")


async def run_benchmark(cfg: RunConfig, workload: list[WorkloadRequest]) -> tuple[list[RequestResult], float]:
    """Send the workload open-loop; returns per-request results (in workload order) and the wall time."""
    base = cfg.base_url.rstrip("/")
    limit = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
    offsets = arrival_offsets(len(workload), cfg.request_rate, cfg.seed)
    # limit=0: no connection-pool cap, so concurrency is set by the arrivals and --max-concurrency alone.
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=cfg.timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as s:
        model = cfg.model
        if model is None:  # the server's first (usually only) model
            async with s.get(f"{base}/models") as resp:
                model = (await resp.json())["data"][0]["id"]
        start = time.perf_counter()

        async def one(req: WorkloadRequest, offset: float) -> RequestResult:
            await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
            async with limit or contextlib.nullcontext():
                return await send_request(s, f"{base}/completions", model, req, cfg.temperature)

        results = await asyncio.gather(*(one(r, o) for r, o in zip(workload, offsets, strict=True)))
        return list(results), time.perf_counter() - start


def json_safe(obj):
    """inf/NaN (an unlimited rate, a percentile of nothing) become null: strict JSON has neither."""
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    return None if isinstance(obj, float) and not math.isfinite(obj) else obj


def format_table(summary: dict) -> str:
    """One row per figure; the keys carry their units."""
    rows = []
    for key, value in summary.items():
        items = value.items() if isinstance(value, dict) else [("", value)]
        rows += [(f"{key} {sub}".strip(), v) for sub, v in items]
    text = {int: "{}", float: "{:.2f}", type(None): "-"}
    return "\n".join(f"{k:<32}{text[type(v)].format(v):>16}" for k, v in rows)


def build_workload(a: argparse.Namespace) -> list[WorkloadRequest]:
    if a.workload == "random":
        return random_workload(a.num_prompts, a.input_len, a.output_len, a.seed)
    return shared_prefix_workload(
        a.num_prompts, a.num_prefixes, a.prefix_len, a.suffix_len, a.output_len, a.seed
    )


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, RunConfig]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", required=True, help="the server's OpenAI base, e.g. http://HOST:PORT/v1")
    p.add_argument("--model", default=None, help="model name to send (default: the first of /models)")
    p.add_argument("--workload", choices=["random", "shared-prefix"], default="random")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--input-len", type=int, default=512, help="random workload: prompt length")
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--num-prefixes", type=int, default=4)
    p.add_argument("--prefix-len", type=int, default=1024)
    p.add_argument("--suffix-len", type=int, default=64)
    p.add_argument("--request-rate", type=float, default=math.inf, help="requests/s (Poisson) or inf")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", dest="timeout_s", type=float, default=600.0, help="seconds per request")
    p.add_argument("--goodput-ttft-ms", type=float, default=None)
    p.add_argument("--goodput-tpot-ms", type=float, default=None)
    p.add_argument("--json-out", default=None)
    a = p.parse_args(argv)
    for name in ("num_prompts", "input_len", "output_len", "num_prefixes", "prefix_len", "suffix_len"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    try:
        return a, RunConfig(**{f.name: getattr(a, f.name) for f in fields(RunConfig)})
    except ValueError as e:
        p.error(str(e))


def main(argv: list[str] | None = None) -> int:
    a, cfg = parse_args(argv)
    results, duration = asyncio.run(run_benchmark(cfg, build_workload(a)))
    summary = summarize(results, duration, a.goodput_ttft_ms, a.goodput_tpot_ms)
    print(format_table(summary))
    errors = [r.error for r in results if not r.ok]
    if errors:
        print(f"first error: {errors[0]}", file=sys.stderr)
    if a.json_out:
        doc = {"args": vars(a), "summary": summary, "errors": errors[:20]}
        Path(a.json_out).write_text(json.dumps(json_safe(doc), indent=2))
    return 0 if summary["completed"] else 1


if __name__ == "__main__":
    sys.exit(main())
