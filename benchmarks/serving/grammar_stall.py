"""Do grammar requests stall the other streams? Plain streams' inter-token gaps while structured-output
requests arrive, against an OpenAI-compatible server (a pdserve cluster, vLLM, SGLang).

    python benchmarks/serving/grammar_stall.py --base-url http://HOST:PORT/v1 [--streams 8]
        [--grammars 12 --grammar-every-s 0.5] [--max-tokens 160]

`--streams` chat completions stream `--max-tokens` tokens each (greedy, ignore_eos); after `--warmup-s`
one JSON-schema request (response_format json_schema, a different schema name each, 4 tokens) is sent
every `--grammar-every-s` until `--grammars` were sent. A server that builds a request's grammar
(matcher and first mask: milliseconds to seconds) inside its engine step stalls every stream of that
worker; one that builds it aside does not. Printed: the gaps between the plain streams' chunks (p50,
p90, p99, max, and how many exceeded `--stall-ms`) and the grammar requests' status codes.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import httpx

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "city": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "city", "age", "tags"],
}


async def plain_stream(
    client: httpx.AsyncClient, url: str, i: int, max_tokens: int, gaps: list[float]
) -> None:
    body = {
        "messages": [{"role": "user", "content": f"Write a long story, number {i}."}],
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": 0,
        "ignore_eos": True,
    }
    last = None
    async with client.stream("POST", f"{url}/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                now = time.perf_counter()
                if last is not None:
                    gaps.append(now - last)
                last = now


async def grammar_request(client: httpx.AsyncClient, url: str, i: int) -> int:
    schema = {"name": f"person_{i}", "schema": SCHEMA}
    body = {
        "messages": [{"role": "user", "content": f"Person {i} as JSON."}],
        "max_tokens": 4,
        "response_format": {"type": "json_schema", "json_schema": schema},
    }
    return (await client.post(f"{url}/chat/completions", json=body)).status_code


async def run(args) -> tuple[list[float], list[int]]:
    gaps: list[float] = []
    async with httpx.AsyncClient(timeout=args.timeout_s) as client:
        streams = [
            asyncio.create_task(plain_stream(client, args.base_url, i, args.max_tokens, gaps))
            for i in range(args.streams)
        ]
        await asyncio.sleep(args.warmup_s)
        sent = []
        for i in range(args.grammars):
            sent.append(asyncio.create_task(grammar_request(client, args.base_url, i)))
            await asyncio.sleep(args.grammar_every_s)
        await asyncio.gather(*streams)
        return gaps, list(await asyncio.gather(*sent))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument("--grammars", type=int, default=12)
    p.add_argument("--grammar-every-s", type=float, default=0.5)
    p.add_argument("--warmup-s", type=float, default=3.0)
    p.add_argument("--stall-ms", type=float, default=500.0)
    p.add_argument("--timeout-s", type=float, default=300.0)
    args = p.parse_args()
    gaps, codes = asyncio.run(run(args))
    if not gaps:
        raise SystemExit("no gaps measured (did the streams produce chunks?)")
    gaps.sort()

    def ms(q: float) -> float:
        return gaps[min(len(gaps) - 1, int(q * len(gaps)))] * 1000

    stalls = sum(g * 1000 > args.stall_ms for g in gaps)
    print(
        f"plain-stream gaps {len(gaps)}: p50 {ms(0.5):.1f} p90 {ms(0.9):.1f} p99 {ms(0.99):.1f} "
        f"max {gaps[-1] * 1000:.1f} ms, over {args.stall_ms:g} ms: {stalls}; grammar requests: {codes}"
    )


if __name__ == "__main__":
    main()
