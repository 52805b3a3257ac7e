"""How many streamed output tokens (and admitted requests) per second the router fronts carry, with
workers that cost nothing.

Real router fronts (`python -m router`; with `--api-servers N`, N of them on one port the way
deploy/fronts.py starts them: SO_REUSEPORT, each its own ZMQ inbox), `--workers` firehose workers
(benchmarks/serving/firehose_worker.py: processes speaking the real wire protocol over ZMQ; they
register as mixed workers with every front and answer each GenerateRequest by emitting one token per
running request every `--step-ms`, like a decode batch, to the front that admitted it) and
`--client-procs` client processes (benchmarks/serving/sse_clients.py) that keep `--concurrency`
streaming completions in flight through the shared port.

    python benchmarks/serving/router_throughput.py --duration 20 --concurrency 512 --client-procs 8 \
        --workers 4 --token-batch                         # streamed tokens/s
    python benchmarks/serving/router_throughput.py --max-tokens 1 --step-ms 0 --concurrency 64
                                                          # admitted requests/s (one token each)
    python benchmarks/serving/router_throughput.py --api-servers 1,2,4,8 --load-per-front \
        --router-cpu 0-7 --token-batch --step-ms 0        # a sweep: one table row per front count
    python benchmarks/serving/router_throughput.py --request-rate 1000 --max-tokens 1 --step-ms 0 \
        --client-procs 4                                  # the router's own TTFT at 1,000 requests/s

Reported: output tokens/s (completed requests' tokens over the wall time), SSE chunks/s, tokens per
chunk (above 1 when a front coalesced tokens for a client that fell behind), requests/s, and the
fronts' CPU use summed over all of them (1.0 = one core busy) and their CPU time per token and per
completed request, and the clients' time to first token (p50 / p99 / mean ms): with `--step-ms 0`
the firehose workers answer at once, so it is what the fronts (and the client's own event loop) add;
`front_ttft_ms_mean`, the fronts' own TTFT from their /metrics (a sequence's arrival stamp, after
parsing, validation and planning, to its first token in the request's task), splits it.
`--bare-http` puts a bare ASGI app under the same uvicorn in the router's place (benchmarks/serving/
bare_front.py: JSON in, the same SSE chunks out, no routing or workers): the HTTP stack's floor, to
read the router's own cost against; `--bare-http raw`, an asyncio protocol that writes the HTTP
itself: what is left below uvicorn. Their chunks follow `--step-ms` as the firehose workers' do.
`--request-rate R` sends requests at R per second in all (Poisson arrivals, open loop) instead of
keeping `--concurrency` in flight. A sweep also prints each row's scaling against linear from its
first row.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.serving.bare_front import KINDS as BARE_KINDS  # noqa: E402 - after the sys.path line
from benchmarks.serving.bare_front import BareFront  # noqa: E402
from benchmarks.serving.router_fronts import (  # noqa: E402
    RouterFronts,
    cpu_list,
    cpu_seconds,
    start_profiler,
    wait_healthy,
)
from benchmarks.serving.sse_clients import ClientResult, run_clients  # noqa: E402
from benchmarks.serving.throughput_report import front_ttft, print_summary, print_sweep, run_summary  # noqa: E402

# Prompt length of every request (env, so the spawned client processes see it too): admission cost
# grows with it (JSON parsing, validation, block hashes), the per-token path does not.
PROMPT_TOKENS = int(os.environ.get("ROUTER_BENCH_PROMPT_TOKENS", "32"))
REPLY_TEXT = " The quick brown fox jumps over the lazy dog, and then it runs back home again."


@dataclass(frozen=True)
class WorkerSpec:
    worker_id: str
    inboxes: list[str]
    reply: list[int]
    step_s: float
    tokens_per_message: int
    token_batch: bool


def run_worker(spec: WorkerSpec, stop, cpus: set[int] | None) -> None:  # a child process
    from benchmarks.serving.firehose_worker import FirehoseWorker

    if cpus:
        os.sched_setaffinity(0, cpus)
    FirehoseWorker(
        spec.worker_id, spec.inboxes, spec.reply, spec.step_s, spec.tokens_per_message, spec.token_batch
    ).run(stop)


@dataclass(frozen=True)
class Load:
    """What one run offers: the totals over all fronts."""

    fronts: int
    concurrency: int
    client_procs: int
    workers: int

    @classmethod
    def of(cls, a: argparse.Namespace, fronts: int) -> Load:
        k = fronts if a.load_per_front else 1  # the workers serve every front: their number stays
        return cls(fronts, a.concurrency * k, a.client_procs * k, 0 if a.bare_http else a.workers)


def run(a: argparse.Namespace, load: Load, model: str, reply: list[int]) -> dict:
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        fronts_args = (model, Path(tmp), a.router_arg, a.router_cpu)
        if a.bare_http:
            fronts: RouterFronts = BareFront(a.bare_http, a.step_ms, *fronts_args)
        else:
            fronts = RouterFronts(*fronts_args)
        stop, procs = ctx.Event(), []
        try:
            fronts.start(load.fronts)
            worker_cpus = a.worker_cpus or fronts.other_cpus()
            for i in range(load.workers):
                spec = WorkerSpec(
                    f"firehose-{i}",
                    fronts.inboxes,
                    reply,
                    a.step_ms / 1e3,
                    a.tokens_per_message,
                    a.token_batch,
                )
                procs.append(ctx.Process(target=run_worker, args=(spec, stop, worker_cpus), daemon=True))
            for p in procs:
                p.start()
            wait_healthy(fronts.url, load.fronts, load.workers)
            return _measure(a, load, ctx, fronts, [p.pid for p in procs]) | {"model": model}
        finally:
            stop.set()
            fronts.stop()
            for p in procs:
                p.join(5)


def _request_body(a: argparse.Namespace) -> dict:
    return {
        "prompt": list(range(1000, 1000 + PROMPT_TOKENS)),
        "max_tokens": a.max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def _measure(a: argparse.Namespace, load: Load, ctx, fronts: RouterFronts, worker_pids: list[int]) -> dict:
    out = ctx.Queue()
    start_at = time.time() + 2.0  # every client process connected and waiting
    end_at = start_at + a.duration
    n, procs = load.concurrency, load.client_procs
    per_proc = [n // procs + (i < n % procs) for i in range(procs)]
    rate = a.request_rate / procs if a.request_rate else None
    url, body = f"{fronts.url}/v1/completions", _request_body(a)  # one port: the kernel spreads them
    cpus = a.client_cpus or fronts.other_cpus()
    clients = [
        ctx.Process(target=run_clients, args=(url, k, body, start_at, end_at, out, cpus, rate), daemon=True)
        for k in per_proc
        if k
    ]
    for c in clients:
        c.start()
    time.sleep(max(0.0, start_at - time.time()))
    profiler = start_profiler(a.profile_out, fronts.pids[0], a.duration)
    cpu0, ttft0 = fronts.cpu_seconds(), fronts.ttft_totals()
    others = {"worker": worker_pids, "client": [c.pid for c in clients]}
    others0 = {kind: cpu_seconds(pids) for kind, pids in others.items()}
    results = [ClientResult(**out.get()) for _ in clients]
    wall = max(r.last_done for r in results) - start_at if any(r.requests for r in results) else a.duration
    cpu = [after - before for before, after in zip(cpu0, fronts.cpu_seconds(), strict=True)]
    ttft1 = fronts.ttft_totals()
    # Workers and clients must not be what limits the run: their CPU use says whether they were.
    spent = {
        f"{kind}_cpu_cores": (sum(cpu_seconds(pids)) - sum(others0[kind])) / wall
        for kind, pids in others.items()
    }
    for c in clients:
        c.join(10)
    if profiler is not None:
        profiler.wait(30)
    return run_summary(a, load, results, wall, cpu) | spent | front_ttft(ttft0, ttft1)


def _front_counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or N,M,... front counts, got {text!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"front counts must be >= 1, got {text!r}")
    return counts


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--model", default=None, help="model directory for the tokenizer (default: the default model)"
    )
    p.add_argument("--duration", type=float, default=10.0, help="seconds of load")
    p.add_argument(
        "--concurrency", type=int, default=256, help="streams in flight, over all client processes"
    )
    p.add_argument("--client-procs", type=int, default=2)
    p.add_argument(
        "--request-rate",
        type=float,
        default=None,
        help="open loop: requests per second over all clients (Poisson) instead of --concurrency",
    )
    p.add_argument("--workers", type=int, default=2, help="firehose worker processes")
    p.add_argument(
        "--step-ms", type=float, default=10.0, help="a worker emits one token per request this often"
    )
    p.add_argument("--tokens-per-message", type=int, default=1)
    p.add_argument(
        "--token-batch", action="store_true", help="each step's mid-stream tokens as one TokenBatch"
    )
    p.add_argument("--max-tokens", type=int, default=256, help="output tokens per request (1: requests/s)")
    p.add_argument(
        "--api-servers",
        type=_front_counts,
        default=[1],
        help="router fronts on one port; N,M,... runs a sweep (one table row per count)",
    )
    p.add_argument(
        "--load-per-front",
        action="store_true",
        help="--concurrency and --client-procs are per front (a sweep's load grows with it)",
    )
    p.add_argument("--router-arg", action="append", default=[], help="extra router flag (repeatable)")
    p.add_argument(
        "--router-cpu",
        type=cpu_list,
        default=None,
        help="pin the fronts to these CPUs (e.g. 0 or 0-7: front i on the i-th), the rest elsewhere",
    )
    p.add_argument(
        "--worker-cpus", type=cpu_list, default=None, help="pin the firehose workers to these CPUs"
    )
    p.add_argument(
        "--client-cpus", type=cpu_list, default=None, help="pin the client processes to these CPUs"
    )
    p.add_argument(
        "--bare-http",
        nargs="?",
        const="asgi",
        default=None,
        choices=BARE_KINDS,
        help="a bare front instead of the router (no workers): the HTTP floor, an ASGI app under "
        "uvicorn (asgi, the default) or an asyncio protocol writing HTTP itself (raw)",
    )
    p.add_argument("--json-out", default=None)
    p.add_argument("--profile-out", default=None, help="py-spy front 0 into this SVG (or .json, .txt)")
    a = p.parse_args(argv)
    for name in ("concurrency", "client_procs", "workers", "tokens_per_message", "max_tokens"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.request_rate is not None and not a.request_rate > 0:
        p.error("--request-rate must be > 0")
    if a.bare_http and a.api_servers != [1]:
        p.error("--bare-http runs one front (--api-servers 1)")
    if not a.duration > 0 or not a.step_ms >= 0:
        p.error("--duration must be > 0 and --step-ms >= 0")
    return a


def main(argv: list[str] | None = None) -> int:
    from common.tools.default_model import prepare_default_model
    from router.tokenizer import ModelTokenizer

    a = parse_args(argv)
    model = a.model or str(prepare_default_model(progress=False))
    reply = ModelTokenizer.from_dir(model).encode(REPLY_TEXT, add_special_tokens=False)
    rows = [run(a, Load.of(a, n), model, reply) for n in a.api_servers]
    for row in rows:
        print_summary(row)
    if len(rows) > 1:
        print_sweep(rows)
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(rows[0] if len(rows) == 1 else rows, indent=2))
    return 0 if all(r["output_tokens_per_s"] > 0 and not r["errors"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
