"""One streamed /v1/completions request, timed: TTFT, every inter-token gap, and the final usage chunk.

Apart from benchmarks/serving/serving.py, which decides when requests go out and how many at once,
because this is the part that must keep up with the server: one process reads tens of thousands of
chunks a second only because chunks past the first text are matched, not parsed. The timed workloads
(benchmarks/serving/workloads.py) send through the same function.
"""

from __future__ import annotations

import json
import re
import time

import aiohttp

from benchmarks.serving.serving_stats import RequestResult
from benchmarks.serving.workloads import WorkloadRequest

# Chunks after the first text that carry neither are not parsed at all (one process then keeps up with
# far more chunks per second); JSON strings escape their quotes, so text can never match.
_USAGE_OR_ERROR = re.compile(rb'"usage"\s*:\s*\{|"error"\s*:')
# A chunk without text (a finish, or chat's role chunk) is no token: it opens no inter-token gap.
_NO_TEXT = re.compile(rb'"(?:text|content)"\s*:\s*(?:""|null)|"delta"\s*:\s*\{\s*\}')

# Fixed for every request: streamed, with a usage chunk at the end, and exactly max_tokens generated.
FIXED_FIELDS = {"ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}


async def send_request(session, url: str, model: str, req: WorkloadRequest, temperature: float):
    payload = FIXED_FIELDS | {"model": model, "prompt": req.prompt, "max_tokens": req.max_tokens}
    payload["temperature"] = temperature
    t0 = time.perf_counter()
    result = RequestResult(sent_at=time.time())
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
    last_text_at = 0.0
    async for raw in resp.content:
        if not raw.startswith(b"data:"):
            continue  # blank separators, SSE comments (keep-alives)
        if raw.removeprefix(b"data:").strip() == b"[DONE]":
            break
        if result.ttft_s is not None and not _USAGE_OR_ERROR.search(raw):
            if not _NO_TEXT.search(raw):  # a text chunk after the first: its gap, and no JSON parse
                now = time.perf_counter()
                result.itl_s.append(now - last_text_at)
                last_text_at = now
            continue
        chunk = json.loads(raw.removeprefix(b"data:"))
        if "error" in chunk:
            result.error = str(chunk["error"])[:200]
            return None
        if result.ttft_s is None and any(c.get("text") for c in chunk.get("choices") or []):
            last_text_at = time.perf_counter()
            result.ttft_s = last_text_at - t0
        usage = chunk.get("usage") or usage
    return usage
