"""Time-driven serving workloads for `benchmarks/serving.py`: interference and multi-turn.

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
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

# Same range as serving.py's prompts: above the special tokens, below any real vocabulary size.
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
