"""Serving workloads for `benchmarks/serving/serving.py`: request-count ones (random, shared-prefix, sent by
a Poisson process) and time-driven ones (interference and multi-turn).

Both take `send`, a coroutine that sends one request and returns its result (serving.py's
`send_request` bound to a session), so the HTTP side and the metrics stay in one place.

interference  the case disaggregation exists for: `chat_concurrency` clients each send chat-length
              requests back to back (closed loop) for `duration_s`, while long prompts of `long_len`
              tokens arrive every 1/`long_rate` seconds. The chat requests' TPOT shows how much the
              long prefills stall decoding; the long ones' TTFT shows what they wait.
multi-turn    `num_conversations` conversations of `turns` turns each, `max_concurrency` at a time;
              turn k's prompt is turn k-1's prompt, an answer of `output_len` tokens and a new user
              message of `input_len` tokens, so every turn after the first repeats a cached prefix.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

# Prompts are token ids (the completions API takes them), so input lengths are exact whatever the
# tokenizer; drawn above the special tokens that vocabularies put first, below any real vocabulary size.
TOKEN_RANGE = (100, 10_000)
LONG_OUTPUT_TOKENS = 16  # a long prompt's answer: short, so it measures prefill, not decode


@dataclass(frozen=True)
class Turn:
    """One request of a time-driven workload; `kind` tags it for per-class statistics."""

    prompt: list[int]
    max_tokens: int
    kind: str


Send = Callable[[Turn], Awaitable[Any]]


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(*TOKEN_RANGE) for _ in range(n)]


@dataclass(frozen=True)
class WorkloadRequest:
    prompt: list[int]
    max_tokens: int
    prefix_id: int | None = None  # which shared prefix (shared-prefix workload)


def random_workload(num: int, input_len: int, output_len: int, seed: int) -> list[WorkloadRequest]:
    rng = random.Random(seed)
    return [WorkloadRequest(_tokens(rng, input_len), output_len) for _ in range(num)]


def shared_prefix_workload(
    num: int, num_prefixes: int, prefix_len: int, suffix_len: int, output_len: int, seed: int
) -> list[WorkloadRequest]:
    """`num` requests over `num_prefixes` long prefixes, each used about equally, in random order."""
    rng = random.Random(seed)
    prefixes = [_tokens(rng, prefix_len) for _ in range(num_prefixes)]
    ids = [i % num_prefixes for i in range(num)]
    rng.shuffle(ids)
    return [WorkloadRequest(prefixes[i] + _tokens(rng, suffix_len), output_len, i) for i in ids]


def arrival_offsets(num: int, rate: float, seed: int) -> list[float]:
    """Seconds from the start at which each request is sent: a Poisson process, or all at 0."""
    if math.isinf(rate):
        return [0.0] * num
    rng = random.Random(seed)
    return list(itertools.accumulate((rng.expovariate(rate) for _ in range(num - 1)), initial=0.0))


async def interference(
    send: Send,
    duration_s: float,
    chat_concurrency: int,
    input_len: int,
    output_len: int,
    long_len: int,
    long_rate: float,
    seed: int,
) -> tuple[list[tuple[str, Any]], float]:
    """Results as (kind, result) in completion order, and the wall time (until the last one ends)."""
    rng = random.Random(seed)
    results: list[tuple[str, Any]] = []
    start = time.perf_counter()
    end = start + duration_s

    async def chat_client() -> None:
        while time.perf_counter() < end:
            turn = Turn(_tokens(rng, input_len), output_len, "chat")
            results.append((turn.kind, await send(turn)))

    async def long_one(at: float) -> None:
        await asyncio.sleep(max(0.0, at - time.perf_counter()))
        turn = Turn(_tokens(rng, long_len), LONG_OUTPUT_TOKENS, "long")
        results.append((turn.kind, await send(turn)))

    arrivals = [start + k / long_rate for k in range(max(1, int(duration_s * long_rate)))]
    await asyncio.gather(*(chat_client() for _ in range(chat_concurrency)), *(long_one(t) for t in arrivals))
    return results, time.perf_counter() - start


async def multi_turn(
    send: Send,
    num_conversations: int,
    turns: int,
    input_len: int,
    output_len: int,
    max_concurrency: int,
    seed: int,
) -> tuple[list[tuple[str, Any]], float]:
    """Results tagged "turn1" (cold) or "later" (a cached prefix is expected), and the wall time."""
    rng = random.Random(seed)
    limit = asyncio.Semaphore(max_concurrency)
    results: list[tuple[str, Any]] = []

    async def conversation() -> None:
        history: list[int] = []
        async with limit:
            for k in range(turns):
                prompt = history + _tokens(rng, input_len)
                kind = "turn1" if k == 0 else "later"
                results.append((kind, await send(Turn(prompt, output_len, kind))))
                history = prompt + _tokens(rng, output_len)  # stands in for the model's answer

    start = time.perf_counter()
    await asyncio.gather(*(conversation() for _ in range(num_conversations)))
    return results, time.perf_counter() - start


async def run_timed(a, base_url: str, model: str, send_request, request_type) -> tuple[dict, float]:
    """Run the `a.workload` time-driven workload against `base_url` with one client session.

    `send_request(session, url, model, request, temperature)` and `request_type(prompt, max_tokens)` are
    serving.py's, passed in so the HTTP side stays there. Returns results grouped by kind (plus "all")
    and the wall time."""
    import aiohttp

    url = f"{base_url.rstrip('/')}/completions"
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=a.timeout_s)
    ) as s:

        async def send(turn: Turn):
            return await send_request(
                s, url, model, request_type(turn.prompt, turn.max_tokens), a.temperature
            )

        if a.workload == "interference":
            tagged, seconds = await interference(
                send,
                a.duration,
                a.chat_concurrency,
                a.input_len,
                a.output_len,
                a.long_len,
                a.long_rate,
                a.seed,
            )
        else:
            tagged, seconds = await multi_turn(
                send, a.num_conversations, a.turns, a.input_len, a.output_len, a.max_concurrency or 64, a.seed
            )
    groups: dict[str, list] = {"all": [r for _, r in tagged]}
    for kind, result in tagged:
        groups.setdefault(kind, []).append(result)
    return groups, seconds


def add_timed_args(p) -> None:
    """serving.py's flags for the interference and multi-turn workloads."""
    p.add_argument("--duration", type=float, default=30.0, help="interference: seconds of chat traffic")
    p.add_argument("--chat-concurrency", type=int, default=64, help="interference: chat clients")
    p.add_argument("--long-len", type=int, default=6000, help="interference: long prompt length")
    p.add_argument("--long-rate", type=float, default=1.0, help="interference: long prompts per second")
    p.add_argument("--num-conversations", type=int, default=64, help="multi-turn: conversations")
    p.add_argument("--turns", type=int, default=4, help="multi-turn: turns per conversation")
