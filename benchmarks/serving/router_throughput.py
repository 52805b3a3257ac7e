"""How many streamed output tokens per second the router carries, with workers that cost nothing.

A real router process (`python -m router`), `--workers` firehose workers (processes speaking the real
wire protocol over ZMQ: they register as mixed workers and answer each GenerateRequest by emitting one
token per running request every `--step-ms`, like a decode batch, `--tokens-per-message` tokens per
TokenOutput), and `--client-procs` client processes that keep `--concurrency` streaming completions
in flight between them. Clients do not parse every chunk: they count SSE events and read the token
count from the final usage chunk, so one client process carries far more than the router can send.

    python benchmarks/serving/router_throughput.py --duration 20 --concurrency 512 --client-procs 8 \
        --workers 4

Reported: output tokens/s (completed requests' tokens over the wall time), SSE chunks/s, tokens per
chunk (above 1 when the router coalesced tokens for a client that fell behind), requests/s, and the
router process's CPU use (1.0 = one core busy: the router is the bottleneck) and its CPU time per token and
per completed request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# Prompt length of every request (env, so the spawned client processes see it too): admission cost
# grows with it (JSON parsing, validation, block hashes), the per-token path does not.
PROMPT_TOKENS = int(os.environ.get("ROUTER_BENCH_PROMPT_TOKENS", "32"))
REPLY_TEXT = " The quick brown fox jumps over the lazy dog, and then it runs back home again."


@dataclass(frozen=True)
class WorkerSpec:
    worker_id: str
    inbox: str
    reply: list[int]
    step_s: float
    tokens_per_message: int
    token_batch: bool


def _pin(cpus: set[int] | None) -> None:
    if cpus:
        os.sched_setaffinity(0, cpus)


def run_worker(spec: WorkerSpec, stop: mp.Event, cpus: set[int] | None) -> None:  # a child process
    from benchmarks.serving.firehose_worker import FirehoseWorker

    _pin(cpus)
    FirehoseWorker(
        spec.worker_id, spec.inbox, spec.reply, spec.step_s, spec.tokens_per_message, spec.token_batch
    ).run(stop)


@dataclass
class ClientResult:
    tokens: int = 0
    chunks: int = 0
    requests: int = 0
    errors: int = 0
    last_done: float = 0.0
    first_error: str = ""


def run_clients(
    url: str, concurrency: int, max_tokens: int, start_at: float, end_at: float, out, cpus
) -> None:
    _pin(cpus)
    result = asyncio.run(_clients(url, concurrency, max_tokens, start_at, end_at))
    out.put(asdict(result))


async def _clients(url: str, concurrency: int, max_tokens: int, start_at: float, end_at: float):
    import aiohttp

    result = ClientResult()
    body = {
        "prompt": list(range(1000, 1000 + PROMPT_TOKENS)),
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as s:
        await asyncio.sleep(max(0.0, start_at - time.time()))

        async def loop() -> None:
            while time.time() < end_at:
                await _one(s, url, body, result)

        await asyncio.gather(*(loop() for _ in range(concurrency)))
    return result


async def _one(session, url: str, body: dict, result: ClientResult) -> None:
    chunks, tail = 0, b""
    try:
        async with session.post(url, json=body) as resp:
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
            async for data in resp.content.iter_any():
                chunks += data.count(b"data: ")
                tail = (tail + data)[-4096:]
    except Exception as e:  # counted, not fatal: the run goes on
        result.errors += 1
        result.first_error = result.first_error or f"{type(e).__name__}: {e}"[:300]
        return
    usage_at = tail.rfind(b'"usage":{')
    if usage_at < 0:
        result.errors += 1
        result.first_error = result.first_error or "no usage chunk"
        return
    usage = json.loads(tail[tail.rfind(b"data: ", 0, usage_at) + 6 :].split(b"\n", 1)[0])["usage"]
    result.tokens += usage["completion_tokens"]
    result.chunks += chunks - 2  # minus the usage chunk and [DONE]
    result.requests += 1
    result.last_done = time.time()


def _start_router(model: str, ready: Path, extra: list[str], cpu: int | None) -> subprocess.Popen:
    argv = [sys.executable, "-m", "router", "--model", model, "--port", "0", "--ready-file", str(ready)]
    argv += ["--log-level", "warning", "--max-running-requests", "100000", *extra]
    pin = None if cpu is None else (lambda: os.sched_setaffinity(0, {cpu}))
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, preexec_fn=pin)
    deadline = time.time() + 60
    while not ready.exists():
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError("the router did not start")
        time.sleep(0.05)
    return proc


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _others(a: argparse.Namespace) -> set[int] | None:
    """With --router-cpu, every other process runs on the remaining CPUs."""
    if a.router_cpu is None:
        return None
    return (os.sched_getaffinity(0) - {a.router_cpu}) or None


def _start_profiler(out: str | None, pid: int, duration: float) -> subprocess.Popen | None:
    """py-spy on the router for the measured window: a flame graph SVG, speedscope .json or
    collapsed stacks .txt."""
    if out is None:
        return None
    fmt = {".json": "speedscope", ".txt": "raw"}.get(Path(out).suffix, "flamegraph")
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    argv = [exe, "record", "--pid", str(pid), "--duration", str(int(duration)), "-o", out, "-f", fmt]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL)


def _wait_healthy(url: str, workers: int) -> None:
    import urllib.request

    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health") as r:
                if len(json.loads(r.read())["workers"]) == workers:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError("workers did not register")


def run(a: argparse.Namespace) -> dict:
    from common.tools.default_model import prepare_default_model
    from router.tokenizer import ModelTokenizer

    model = a.model or str(prepare_default_model(progress=False))
    reply = ModelTokenizer.from_dir(model).encode(REPLY_TEXT, add_special_tokens=False)
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        ready = Path(tmp) / "ready.json"
        router = _start_router(model, ready, a.router_arg, a.router_cpu)
        stop, procs = ctx.Event(), []
        try:
            info = json.loads(ready.read_text())
            for i in range(a.workers):
                spec = WorkerSpec(
                    f"firehose-{i}",
                    info["inbox"],
                    reply,
                    a.step_ms / 1e3,
                    a.tokens_per_message,
                    a.token_batch,
                )
                procs.append(ctx.Process(target=run_worker, args=(spec, stop, _others(a)), daemon=True))
            for p in procs:
                p.start()
            _wait_healthy(info["http"], a.workers)
            return _measure(a, ctx, info["http"], router.pid) | {"model": model}
        finally:
            stop.set()
            router.terminate()
            router.wait(10)
            for p in procs:
                p.join(5)


def _measure(a: argparse.Namespace, ctx, http: str, router_pid: int) -> dict:
    out = ctx.Queue()
    start_at = time.time() + 2.0  # every client process connected and waiting
    end_at = start_at + a.duration
    per_proc = [
        a.concurrency // a.client_procs + (i < a.concurrency % a.client_procs) for i in range(a.client_procs)
    ]
    url = f"{http}/v1/completions"
    clients = [
        ctx.Process(
            target=run_clients, args=(url, n, a.max_tokens, start_at, end_at, out, _others(a)), daemon=True
        )
        for n in per_proc
        if n
    ]
    for c in clients:
        c.start()
    time.sleep(max(0.0, start_at - time.time()))
    profiler = _start_profiler(a.profile_out, router_pid, a.duration)
    cpu0 = _cpu_seconds(router_pid)
    results = [ClientResult(**out.get()) for _ in clients]
    wall = max(r.last_done for r in results) - start_at if any(r.requests for r in results) else a.duration
    cpu = _cpu_seconds(router_pid) - cpu0
    for c in clients:
        c.join(10)
    if profiler is not None:
        profiler.wait(30)
    tokens, chunks = sum(r.tokens for r in results), sum(r.chunks for r in results)
    requests = sum(r.requests for r in results)
    return {
        "output_tokens_per_s": tokens / wall,
        "sse_chunks_per_s": chunks / wall,
        "tokens_per_chunk": tokens / chunks if chunks else 0.0,
        "requests_per_s": requests / wall,
        "errors": sum(r.errors for r in results),
        "first_error": next((r.first_error for r in results if r.first_error), ""),
        "router_cpu_cores": cpu / wall,
        "router_cpu_us_per_token": 1e6 * cpu / tokens if tokens else 0.0,
        "router_cpu_us_per_request": 1e6 * cpu / requests if requests else 0.0,
        "wall_s": wall,
        "args": vars(a),
    }


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
    p.add_argument("--workers", type=int, default=2, help="firehose worker processes")
    p.add_argument(
        "--step-ms", type=float, default=10.0, help="a worker emits one token per request this often"
    )
    p.add_argument("--tokens-per-message", type=int, default=1)
    p.add_argument(
        "--token-batch", action="store_true", help="each step's mid-stream tokens as one TokenBatch"
    )
    p.add_argument("--max-tokens", type=int, default=256, help="output tokens per request")
    p.add_argument("--router-arg", action="append", default=[], help="extra router flag (repeatable)")
    p.add_argument(
        "--router-cpu", type=int, default=None, help="pin the router to this CPU, the rest elsewhere"
    )
    p.add_argument("--json-out", default=None)
    p.add_argument("--profile-out", default=None, help="py-spy the router into this SVG (or .json)")
    a = p.parse_args(argv)
    for name in ("concurrency", "client_procs", "workers", "tokens_per_message", "max_tokens"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if not a.duration > 0 or not a.step_ms >= 0:
        p.error("--duration must be > 0 and --step-ms >= 0")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    summary = run(a)
    for key, value in summary.items():
        if key != "args":
            print(f"{key:<24}{value:>16.1f}" if isinstance(value, float) else f"{key:<24}{value!s:>16}")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(summary, indent=2))
    return 0 if summary["output_tokens_per_s"] > 0 and not summary["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
