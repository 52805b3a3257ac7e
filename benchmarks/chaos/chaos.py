"""Chaos soak: steady mixed load on a real cluster while faults are injected at random, then checks.

    python benchmarks/chaos/chaos.py --minutes 30 --prefill 2 --decode 2 --seed 1 \
        [--fault-every 20] [--kv-drop 0.05 --kv-delay 0.05] [--json-out out.json] [launch flags...]

What it does, in order:
1. The offline engine's greedy answer for every (prompt, max_tokens) the load may send (chaos_report).
2. A cluster through deploy.launch's `Cluster` with the local backend (router + workers as processes;
   CPU or GPU as the launch flags say; flags it does not know go to deploy.launch unchanged, e.g.
   `--model`, `--device`, `--num-kvcache-blocks`, `--enforce-eager`), with KV fault injection on in
   the decode workers (`--kv-drop`, `--kv-delay`; kvtransfer/faults.py).
3. For `--minutes`: `--concurrency` closed-loop clients send /v1/completions (greedy and sampled,
   streamed and not; chaos_load) while faults come every `--fault-every` s on average (chaos_faults):
   SIGKILL (the worker is restarted, as a supervisor would) and SIGSTOP/SIGCONT of prefill and decode
   workers, router restarts (one front at random with `--api-servers N`), clients leaving mid-stream;
   RSS of every process is sampled meanwhile.
4. Quiesce: paused workers resumed, killed ones back, every worker live; then wait until every
   worker's KV usage (from its heartbeats, /debug/index `kv_blocks_used`) is back to 0 and no request
   is running; one last greedy request must get the offline answer.
5. Print the counts (requests, outcomes, faults by kind, lost, wrong, leaked blocks, RSS start vs end)
   and exit 1 if a goal is missed: lost == 0, wrong == 0, leaked blocks == 0, RSS growth under
   `--rss-limit-pct` for every process after its warm-up.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.chaos.chaos_faults import FAULT_KINDS, Chaos, FaultConfig  # noqa: E402
from benchmarks.chaos.chaos_load import Mix, Outcome, RequestSpec, prompt_pool, send, settle  # noqa: E402
from benchmarks.chaos.chaos_report import (  # noqa: E402
    RssTrack,
    format_report,
    goals,
    kv_fault_counts,
    offline_references,
    summarize,
)

RSS_EVERY_S = 5.0
T0 = time.monotonic()


def log(message: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {message}", flush=True)


def parse_args(argv: list[str] | None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        epilog="Other flags go to deploy.launch unchanged (e.g. --model, --device, --num-kvcache-blocks).",
    )
    p.add_argument("--minutes", type=float, default=5.0, help="how long the load runs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--concurrency", type=int, default=4, help="closed-loop clients")
    p.add_argument("--max-tokens", default="8,16,32", help="answer lengths drawn from")
    p.add_argument("--choice-share", type=float, default=0.1, help="share of requests with guided_choice")
    p.add_argument("--fault-every", type=float, default=20.0, help="mean seconds between faults")
    p.add_argument("--faults", default=",".join(FAULT_KINDS), help=f"kinds to inject, of {FAULT_KINDS}")
    p.add_argument("--stop-max-s", type=float, default=6.0, help="longest SIGSTOP")
    p.add_argument("--restart-delay-s", type=float, default=1.0, help="before a killed worker restarts")
    p.add_argument("--kv-drop", type=float, default=0.05, help="share of KV fetches dropped")
    p.add_argument("--kv-delay", type=float, default=0.05, help="share of KV fetches delayed")
    p.add_argument("--kv-delay-s", type=float, default=3.0, help="the delay (and when a drop is noticed)")
    p.add_argument("--warmup-s", type=float, default=60.0, help="a process's life before its RSS baseline")
    p.add_argument("--rss-limit-pct", type=float, default=25.0, help="allowed RSS growth after warm-up")
    p.add_argument("--quiesce-timeout", type=float, default=120.0, help="seconds for blocks to come back")
    p.add_argument("--json-out", default=None)
    # Launch flags the soak sets defaults for; anything else goes to deploy.launch as given.
    p.add_argument("--prefill", type=int, default=2)
    p.add_argument("--decode", type=int, default=2)
    p.add_argument("--kv-transport", default="tcp")
    p.add_argument("--request-timeout", type=float, default=60.0)
    p.add_argument("--heartbeat-timeout", type=float, default=2.5)
    p.add_argument("--kv-lease-s", type=float, default=5.0)
    p.add_argument("--log-dir", default=None, help="cluster logs (default: a temporary directory)")
    args, launch_rest = p.parse_known_args(argv)
    if not args.minutes > 0 or args.concurrency < 1:
        p.error("--minutes must be > 0 and --concurrency >= 1")
    try:  # before anything starts
        kinds = tuple(k.strip() for k in args.faults.split(",") if k.strip())
        args.fault_config = FaultConfig(args.fault_every, kinds, args.stop_max_s, args.restart_delay_s)
    except ValueError as e:
        p.error(str(e))
    args.log_dir = args.log_dir or tempfile.mkdtemp(prefix="pdserve-chaos-")
    launch_argv = ["--backend", "local", "--port", "0", "--log-dir", args.log_dir, "--log-level", "warning"]
    for flag in ("prefill", "decode", "kv_transport", "request_timeout", "heartbeat_timeout", "kv_lease_s"):
        launch_argv += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    from deploy.launch_args import parse_args as launch_args

    plan = launch_args(launch_argv + launch_rest)
    if plan.backend != "local":
        # The soak restarts killed workers itself and signals them by pid; Ray's supervisor restarts a
        # worker at most 3 times, which a long soak exceeds. The local backend runs on GPUs as well.
        p.error("only --backend local is supported (it runs GPU workers too)")
    return args, plan


def kv_faults_env(args) -> dict[str, str]:
    from kvtransfer.faults import KVFaults
    from kvtransfer.registry import KV_FAULTS_ENV

    if not (args.kv_drop or args.kv_delay):
        return {}
    faults = KVFaults(drop=args.kv_drop, delay=args.kv_delay, delay_s=args.kv_delay_s, seed=args.seed)
    return {KV_FAULTS_ENV: faults.to_env()}


async def client_loop(i: int, ctx: dict, stop: asyncio.Event, outcomes: list[Outcome]) -> None:
    rng = random.Random(f"{ctx['seed']}:client{i}")
    chaos: Chaos = ctx["chaos"]
    while not stop.is_set():
        spec = ctx["mix"].draw(rng, disconnect=chaos.take_disconnect())
        out = await send(ctx["client"], ctx["url"], spec, ctx["pool"], ctx["client_timeout"])
        outcomes.append(out)
        if out.kind not in ("ok", "disconnected"):
            await asyncio.sleep(1.0)  # no hot loop against a router that is down


async def live_workers(client: httpx.AsyncClient, url: str) -> set[str]:
    """The worker ids the router's /health lists live (none while the router is down)."""
    try:
        workers = (await client.get(f"{url}/health", timeout=5)).json()["workers"]
    except (httpx.HTTPError, ValueError, KeyError):
        return set()
    return {w["worker_id"] for w in workers if w.get("state") == "live"}


async def live_pids(client: httpx.AsyncClient, url: str, chaos: Chaos) -> dict[str, int]:
    """The router's pid and those of the workers the router lists live (so a restarted worker's
    baseline is taken after its model has loaded, not while it loads)."""
    live = await live_workers(client, url)
    return {name: pid for name, pid in chaos.pids().items() if name.startswith("router") or name in live}


async def rss_loop(ctx: dict, rss: RssTrack, stop: asyncio.Event) -> None:
    while not stop.is_set():
        rss.sample(await live_pids(ctx["client"], ctx["url"], ctx["chaos"]))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), RSS_EVERY_S)


async def quiesce(client: httpx.AsyncClient, url: str, cluster, timeout_s: float) -> dict[str, int]:
    """Wait until every worker is live, holds no blocks and no request runs. Returns the blocks still
    held then, per worker (leaked); a worker that is not live by then counts as -1 (unknown)."""
    deadline = time.monotonic() + timeout_s
    held: dict[str, int] = {}
    while time.monotonic() < deadline:
        try:
            index = (await client.get(f"{url}/debug/index", timeout=10)).json()["workers"]
            running = (await client.get(f"{url}/metrics", timeout=10)).text
        except (httpx.HTTPError, ValueError, KeyError):
            await asyncio.sleep(1.0)
            continue
        used = {w["worker_id"]: w.get("kv_blocks_used", -1) for w in index if w["state"] == "live"}
        held = {w.spec.worker_id: used.get(w.spec.worker_id, -1) for w in cluster.workers}
        match = re.search(r"^pdserve_requests_running (\S+)$", running, re.MULTILINE)
        running_now = float(match.group(1)) if match else 0.0  # absent: a new router, never set
        if running_now == 0 and not any(held.values()):
            return {}
        await asyncio.sleep(0.5)
    log(f"quiesce: timed out after {timeout_s:.0f}s; blocks held (-1: not live): {held}")
    return {w: n for w, n in held.items() if n}


async def final_check(client, url: str, pool, refs, timeout_s: float) -> Outcome:
    """After the faults: a greedy request must still get the offline engine's answer."""
    spec = RequestSpec(prompt=0, max_tokens=min(n for _, n in refs), greedy=True, stream=False)
    return await send(client, url, spec, pool, timeout_s)


async def soak(args, cluster, pool, refs, mix: Mix) -> tuple[list[Outcome], Chaos, dict, RssTrack]:
    chaos = Chaos(cluster, args.fault_config, random.Random(f"{args.seed}:faults"))
    rss = RssTrack(args.warmup_s)
    stop, outcomes = asyncio.Event(), []
    limits = httpx.Limits(max_connections=args.concurrency + 8)
    async with httpx.AsyncClient(limits=limits) as client:
        ctx = dict(seed=args.seed, chaos=chaos, mix=mix, client=client, url=cluster.url, pool=pool)
        ctx["client_timeout"] = args.request_timeout + 30.0
        tasks = [asyncio.create_task(client_loop(i, ctx, stop, outcomes)) for i in range(args.concurrency)]
        faults = chaos.run(stop, lambda: live_workers(client, cluster.url))
        side = [asyncio.create_task(faults), asyncio.create_task(rss_loop(ctx, rss, stop))]
        await asyncio.sleep(args.minutes * 60)
        stop.set()
        await asyncio.gather(*tasks, *side)
        log(f"load stopped after {len(outcomes)} requests; resuming paused and killed workers")
        await chaos.settle()
        leaked = await quiesce(client, cluster.url, cluster, args.quiesce_timeout)
        log("quiesced")
        rss.sample(await live_pids(client, cluster.url, chaos))
        outcomes.append(await final_check(client, cluster.url, pool, refs, ctx["client_timeout"]))
    for out in outcomes:
        settle(out, chaos.router_down)
    return outcomes, chaos, leaked, rss


def main(argv: list[str] | None = None) -> int:
    args, plan = parse_args(argv)
    from deploy.launch import Cluster
    from deploy.local_backend import LocalBackend
    from router.tokenizer import ModelTokenizer

    tokenizer = ModelTokenizer.from_dir(plan.model)
    pool = prompt_pool(tokenizer)
    mix = Mix(len(pool), tuple(int(n) for n in args.max_tokens.split(",")), choice_share=args.choice_share)
    lengths = [*mix.max_tokens, max(mix.max_tokens) * 2]  # disconnecting streams ask for the longest
    log(f"offline references for {len(pool)} prompts x {len(set(lengths))} lengths")
    refs = offline_references(plan.model, plan.engine, pool, lengths, tokenizer)
    log("offline references done; starting the cluster")
    os.environ.update(kv_faults_env(args))  # the workers inherit it (the router ignores it)
    cluster = Cluster(plan, LocalBackend(plan.log_dir))
    chaos = None
    try:
        log(f"cluster ready at {cluster.start()}; soaking for {args.minutes:g} min")
        outcomes, chaos, leaked, rss = asyncio.run(soak(args, cluster, pool, refs, mix))
    finally:
        cluster.shutdown()
        if chaos is not None:
            chaos.close()
    faults = Counter(chaos.counts) + kv_fault_counts(Path(args.log_dir))
    faults["disconnect"] = sum(1 for o in outcomes if o.kind == "disconnected")
    summary = summarize(outcomes, refs, faults, leaked, rss.rows())
    met = goals(summary, args.rss_limit_pct)
    summary.update(goals=met, minutes=args.minutes, seed=args.seed, log_dir=args.log_dir)
    print(format_report(summary, met))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(summary, indent=2))
    return 0 if all(met.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
