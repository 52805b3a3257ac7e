"""The chaos soak's client side: the request mix, one request over the router's HTTP API, and what
became of it (`Outcome`). See benchmarks/chaos/chaos.py for the whole soak.

Requests are /v1/completions with token-id prompts (so the offline engine gets exactly the same ids),
drawn from a seeded mix: greedy or sampled (half of the sampled ones seeded), streamed or not, a few
answer lengths, prompts from a small pool whose half shares one long prefix (so prefix-cache hits,
pinned shared blocks and evictions all happen under faults), and a share constrained to `CHOICES`
(`guided_choice`: grammar matchers built aside on both sides of a hand-off, under the same faults).

Outcomes (one per request, all terminal):
  ok            200 with a finish reason (a stream: a finish reason and `[DONE]`)
  error         a clear error: OpenAI error JSON with 429 / 503 / 504 (or a final SSE error event)
  router_down   the connection failed while the router was being restarted (nothing to answer it)
  disconnected  the client left mid-stream on purpose (a fault)
  lost          anything else: a hang past the client timeout, a connection error with the router up,
                a 200 without a finish reason, a stream cut without `[DONE]`, another status code
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field

import httpx

CLEAR_ERROR_STATUSES = (429, 503, 504)
TEXTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "def fibonacci(n):",
    "Once upon a time, in a small village nestled between rolling hills and a sparkling river, there lived",
    "1, 2, 3, 4, 5,",
    "Translate to French: good morning, my friend. How are you today?",
    "The quick brown fox",
    "Explain photosynthesis in one sentence:",
]
SHARED_PREFIX = (
    "You are a meticulous assistant for a small bakery. The bakery opens at seven in the morning, "
    "sells sourdough, rye and spelt loaves, croissants on weekends only, and closes at three in the "
    "afternoon. Orders above twenty loaves need one day of notice. Answer the customer briefly."
)
QUESTIONS = ["Do you sell rye?", "When do you open?", "Croissants on Monday?", "Can I order 30 loaves?"]
CHOICES = ["yes", "no", "maybe later"]  # a grammar request's only answers (a few tokens, then EOS)


def prompt_pool(tokenizer) -> list[list[int]]:
    """Token ids of the pool: the plain texts, then the questions behind the shared prefix."""
    prefix = tokenizer.encode(SHARED_PREFIX)
    plain = [tokenizer.encode(t) for t in TEXTS]
    return plain + [prefix + tokenizer.encode(f" Question: {q}", False) for q in QUESTIONS]


@dataclass(frozen=True)
class RequestSpec:
    prompt: int  # index into the pool
    max_tokens: int
    greedy: bool
    stream: bool
    seed: int | None = None  # sampled requests only
    disconnect_after: int | None = None  # leave after this many SSE events (a stream fault)
    choice: bool = False  # constrained to CHOICES

    def body(self, pool: list[list[int]]) -> dict:
        body: dict = {"prompt": pool[self.prompt], "max_tokens": self.max_tokens, "stream": self.stream}
        if self.greedy:
            body["temperature"] = 0
        else:
            body.update(temperature=0.8, top_p=0.95)
            if self.seed is not None:
                body["seed"] = self.seed
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        if self.choice:
            body["guided_choice"] = CHOICES
        return body


@dataclass(frozen=True)
class Mix:
    """How requests are drawn."""

    pool_size: int
    max_tokens: tuple[int, ...] = (8, 16, 32)
    greedy_share: float = 0.5
    stream_share: float = 0.5
    choice_share: float = 0.0

    def draw(self, rng: random.Random, disconnect: bool = False) -> RequestSpec:
        stream = disconnect or rng.random() < self.stream_share
        greedy = rng.random() < self.greedy_share
        seed = rng.randrange(1 << 30) if not greedy and rng.random() < 0.5 else None
        return RequestSpec(
            prompt=rng.randrange(self.pool_size),
            max_tokens=max(self.max_tokens) * 2 if disconnect else rng.choice(self.max_tokens),
            greedy=greedy,
            stream=stream,
            seed=seed,
            disconnect_after=rng.randint(1, 3) if disconnect else None,
            choice=rng.random() < self.choice_share,
        )


@dataclass
class Outcome:
    spec: RequestSpec
    started: float  # monotonic
    ended: float = 0.0
    kind: str = "lost"  # see the module docstring
    detail: str = ""  # error code, or why it counts as lost
    text: str = ""
    finish_reason: str | None = None
    completion_tokens: int | None = None
    status: int | None = None
    events: list[str] = field(default_factory=list, repr=False)


async def send(client: httpx.AsyncClient, url: str, spec: RequestSpec, pool, timeout_s: float) -> Outcome:
    """Send one request; never raises for anything the server or the network does."""
    out = Outcome(spec, time.monotonic())
    try:
        async with client.stream(
            "POST", f"{url}/v1/completions", json=spec.body(pool), timeout=timeout_s
        ) as r:
            out.status = r.status_code
            if r.status_code != 200:
                await r.aread()
                _error_answer(out, r.status_code, r.text)
            elif spec.stream:
                await _read_stream(r, out)
            else:
                await r.aread()
                _plain_answer(out, r.json())
    except httpx.TimeoutException as e:
        out.kind, out.detail = "lost", f"no answer within {timeout_s:.0f}s ({type(e).__name__})"
    except httpx.TransportError as e:  # refused, reset, cut
        out.kind, out.detail = "transport", f"{type(e).__name__}: {e}"[:200]
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:  # not an OpenAI answer
        out.kind, out.detail = "lost", f"malformed answer: {type(e).__name__}: {e}"[:200]
    out.ended = time.monotonic()
    return out


def _error_answer(out: Outcome, status: int, body: str) -> None:
    try:
        error = json.loads(body)["error"]
        code = error.get("code") or error.get("type")
    except (ValueError, KeyError, TypeError, AttributeError):
        out.kind, out.detail = "lost", f"{status} without OpenAI error JSON: {body[:120]!r}"
        return
    clear = status in CLEAR_ERROR_STATUSES
    out.kind, out.detail = ("error", f"{status} {code}") if clear else ("lost", f"{status} {code}")


def _plain_answer(out: Outcome, data: dict) -> None:
    choice = data["choices"][0]
    out.text, out.finish_reason = choice["text"], choice.get("finish_reason")
    out.completion_tokens = data["usage"]["completion_tokens"]
    out.kind, out.detail = ("ok", "") if out.finish_reason else ("lost", "200 without a finish reason")


async def _read_stream(r: httpx.Response, out: Outcome) -> None:
    parts: list[str] = []
    async for line in r.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        out.events.append(data[:80])
        if data == "[DONE]":
            break
        event = json.loads(data)
        if "error" in event:  # a failure after the 200: a final error event, then [DONE]
            out.kind, out.detail = "error", f"stream {event['error'].get('code')}"
            continue
        for choice in event.get("choices") or []:
            parts.append(choice.get("text") or "")
            out.finish_reason = choice.get("finish_reason") or out.finish_reason
        if event.get("usage"):
            out.completion_tokens = event["usage"]["completion_tokens"]
        if out.spec.disconnect_after is not None and len(out.events) >= out.spec.disconnect_after:
            out.kind, out.detail = "disconnected", f"left after {len(out.events)} events"
            return  # leaving the `async with` closes the connection mid-stream
    out.text = "".join(parts)
    if out.events[-1:] != ["[DONE]"]:
        out.kind, out.detail = "transport", "stream ended without [DONE]"  # cut: see `settle`
    elif out.kind != "error":
        ok = out.finish_reason is not None
        out.kind, out.detail = ("ok", "") if ok else ("lost", "stream without a finish reason")


def settle(out: Outcome, router_down: list[tuple[float, float]]) -> None:
    """A transport failure is `router_down` when the request overlapped a router restart, else lost."""
    if out.kind != "transport":
        return
    overlapped = any(out.started <= end and out.ended >= start for start, end in router_down)
    out.kind = "router_down" if overlapped else "lost"
