"""Host time per engine step of a real mixed worker against the offline engine, on the CPU (issue 26).

    python benchmarks/serving/worker_host.py [--num-requests 1024] [--concurrency 256] [--prompt-len 512]
        [--output-len 128] [--vocab-size 10000] [--repeats 3] [--worker-io thread process] [--json PATH]

On one H200 the default model's GPU step is about 1 ms, so serving is host-bound, and the worker
(common/worker/service.py) adds host time per cycle that the offline engine does not have. This measures
both on the same workload with a tiny random model: `concurrency` requests of `prompt-len` random ids and
`output-len` tokens (T=0.6, ignore_eos) in flight, a new one arriving whenever one finishes, until
`num-requests` have arrived. Offline: the engine itself, topped up in its own loop. Worker: the real
WorkerService with the mixed role and its I/O thread on real ZMQ sockets, in this process; a driver
process (worker_host_driver.py) plays the router. Figures are per engine step over the window of steady
load (batch at least 90% full, until the last request arrives): the engine's host phases as
benchmarks/engine/decode_host.py counts them (the eager forward and the sampler excluded: device work on
the GPU), the worker loop's other phases (wall clock, engine thread), and the I/O thread's CPU time.
Each figure is the median over `--repeats` runs (offline and worker alternate); spreads are min-max.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.engine.decode_host import EXCLUDED, HOST_PHASES  # noqa: E402
from benchmarks.serving.worker_host_driver import DriverPlan, drive  # noqa: E402
from benchmarks.serving.worker_host_phases import (  # noqa: E402
    WORKER_PHASES,
    Clocks,
    Window,
    gate,
    process_cpu_clock,
    thread_cpu_clock,
)
from common.config import EngineConfig  # noqa: E402
from common.llm_engine import LLMEngine  # noqa: E402
from common.wire.sampling_params import SamplingParams  # noqa: E402
from common.worker.config import WORKER_IO_CHOICES, WorkerConfig  # noqa: E402
from common.worker.engine_factory import build_engine  # noqa: E402
from common.worker.service import WorkerService  # noqa: E402
from decode_worker.role import MixedRole  # noqa: E402

DRIVER_START_S = 120.0


def engine_config(model: str, args) -> EngineConfig:
    room = args.prompt_len + args.output_len + 1
    blocks_per_seq = -(-room // args.block_size)
    return EngineConfig(
        model=model,
        max_num_seqs=args.concurrency,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=room,
        kvcache_block_size=args.block_size,
        num_kvcache_blocks=2 * args.concurrency * blocks_per_seq,  # room for a prefix cache to churn
        device="cpu",
        async_scheduling=True,  # run-ahead decoding, as on the GPU
        role="mixed",
    )


def run_offline(config: EngineConfig, plan: DriverPlan) -> dict:
    """The engine alone, topped up to `concurrency` in flight from its own loop."""
    engine, clocks = build_engine(config), Clocks()
    rng = random.Random(plan.seed)
    # Made before the loop, so drawing them is not counted; one SamplingParams per request, as
    # offline.py makes them (and as each request decoded from the wire has its own).
    prompts = [
        [rng.randrange(plan.vocab_size) for _ in range(plan.prompt_len)] for _ in range(plan.num_requests)
    ]
    params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=plan.output_len) for _ in prompts]
    clocks.instrument_engine(config.kvcache_block_size)
    for label in ("make_sequence", "validate_token_ids", "add_sequence"):
        clocks.wrap(LLMEngine, label, label)
    window, loop = Window(clocks, {"main": time.thread_time}), clocks.totals
    submitted = 0
    try:
        for submitted in range(1, min(plan.concurrency, plan.num_requests) + 1):
            engine.add_request(prompts[submitted - 1], params[submitted - 1])
        while engine.has_unfinished:
            t0 = time.perf_counter()
            result = engine.step()
            for update in result.updates:
                if update.finished and submitted < plan.num_requests:
                    engine.add_request(prompts[submitted], params[submitted])
                    submitted += 1
            loop["loop"] += time.perf_counter() - t0
            gate(window, len(engine.scheduler.running), submitted, plan.concurrency, plan.num_requests)
    finally:
        clocks.restore()
    return window.figures or {}


def run_worker(config: EngineConfig, plan: DriverPlan, worker_io: str) -> dict:
    """The real WorkerService (mixed role, ZMQ; its sockets on an I/O thread or in a channel process,
    `worker_io`) against the driver process."""
    spawn = multiprocessing.get_context("spawn")  # no fork of a process that holds torch and threads
    parent, child = spawn.Pipe()
    driver = spawn.Process(target=drive, args=(plan, child), daemon=True)
    driver.start()
    if not parent.poll(DRIVER_START_S):
        raise RuntimeError("the driver process did not start")
    inbox = parent.recv()
    worker = WorkerConfig("worker-host", inbox, config, host="127.0.0.1", worker_io=worker_io)
    service = WorkerService(worker, MixedRole())
    clocks = Clocks()
    clocks.instrument_engine(config.kvcache_block_size)
    clocks.instrument_worker(MixedRole)
    try:
        service.start()
        channels = service.channels
        io_clock = (
            process_cpu_clock(channels._proc.pid)
            if worker_io == "process"
            else thread_cpu_clock(channels._thread.ident)
        )
        window = Window(clocks, {"main": time.thread_time, "io": io_clock})
        while not service.stopping:
            service.run_once()
            running = len(service.engine.scheduler.running)
            gate(window, running, clocks.calls["add_sequence"], plan.concurrency, plan.num_requests)
    finally:
        clocks.restore()
        service.close()
    stats = parent.recv() if parent.poll(30.0) else {"error": "no figures from the driver"}
    driver.join(timeout=10.0)
    if "error" in stats:
        raise RuntimeError(f"driver: {stats['error']}")
    return {**(window.figures or {}), "driver": stats}


def per_step(figures: dict) -> dict[str, float]:
    """Microseconds per engine step, with the derived totals."""
    steps = max(figures.get("steps", 0), 1)
    us = {k: 1e6 * v / steps for k, v in figures.items() if isinstance(v, float) and k != "wall"}
    engine_glue = us.get("step", 0.0) - sum(us.get(k, 0.0) for k in (*HOST_PHASES, *EXCLUDED))
    us["engine glue"] = engine_glue
    us["engine host"] = engine_glue + sum(us.get(k, 0.0) for k in HOST_PHASES)
    us["loop besides step"] = us.get("loop", 0.0) - us.get("step", 0.0)
    us["io other"] = us.get("cpu io", 0.0) - us.get("io decode", 0.0) - us.get("io encode", 0.0)
    us["total host"] = us["engine host"] + us["loop besides step"] + us.get("cpu io", 0.0)
    us["steps"] = figures.get("steps", 0)
    us["requests finished"] = figures.get("driver", {}).get("finished", 0)  # worker runs: all of them
    us["cpu wall ms/step"] = 1e3 * figures.get("wall", 0.0) / steps
    return us


TABLE = (
    [("engine host (GPU path)", "engine host", 0)]
    + [(k, k, 1) for k in HOST_PHASES]
    + [("engine glue", "engine glue", 1)]
    + [("engine-thread loop besides step", "loop besides step", 0)]
    + [(label, label, depth + 1) for label, depth, _, _ in WORKER_PHASES if label != "loop"]
    + [("I/O thread (or process) CPU", "cpu io", 0)]
    + [("io decode", "io decode", 1), ("io encode", "io encode", 1)]
    + [("io other (poll, sockets)", "io other", 1)]
    + [("total host", "total host", 0), ("excluded: " + EXCLUDED[0], EXCLUDED[0], 0)]
    + [("excluded: " + EXCLUDED[1], EXCLUDED[1], 0), ("steps in window", "steps", 0)]
)


def summarise(runs: list[dict]) -> dict[str, dict[str, float]]:
    keys = {k for r in runs for k in r}
    return {
        k: {
            "median": statistics.median(r.get(k, 0.0) for r in runs),
            "min": min(r.get(k, 0.0) for r in runs),
            "max": max(r.get(k, 0.0) for r in runs),
        }
        for k in keys
    }


def print_table(summary: dict[str, dict]) -> None:
    print(f"{'us per engine step (median [min-max])':<40}" + "".join(f"{arm:>24}" for arm in summary))
    for title, key, depth in TABLE:
        cells = "".join(f"{_cell(side.get(key)):>24}" for side in summary.values())
        print(f"{'  ' * depth + title:<40}{cells}")


def _cell(s: dict | None) -> str:
    if s is None:
        return "-"
    return f"{s['median']:.0f} [{s['min']:.0f}-{s['max']:.0f}]"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=int, default=1024)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--vocab-size", type=int, default=10000, help="of the tiny model; prompt ids below it")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--worker-io",
        nargs="+",
        choices=WORKER_IO_CHOICES,
        default=["thread"],
        help="worker arms: where its sockets run (several: one arm each, alternated)",
    )
    ap.add_argument("--json", type=Path, default=None, help="also write every run and the medians here")
    args = ap.parse_args(argv)
    for name in (
        "num_requests",
        "concurrency",
        "prompt_len",
        "output_len",
        "vocab_size",
        "block_size",
        "max_num_batched_tokens",
        "repeats",
    ):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    from common.tools.tiny_models import write_tiny_model

    plan = DriverPlan(args.num_requests, args.concurrency, args.prompt_len, args.output_len, args.vocab_size)
    arms = {f"worker {io}" if len(args.worker_io) > 1 else "worker": io for io in args.worker_io}
    runs: dict[str, list[dict]] = {"offline": [], **{arm: [] for arm in arms}}
    with tempfile.TemporaryDirectory() as tmp:
        room = args.prompt_len + args.output_len + 1
        model = write_tiny_model(
            "llama", Path(tmp) / "llama", vocab_size=args.vocab_size, max_position_embeddings=room
        )
        config = engine_config(str(model), args)
        for _ in range(args.repeats):
            runs["offline"].append(per_step(run_offline(config, plan)))
            for arm, io in arms.items():
                runs[arm].append(per_step(run_worker(config, plan, io)))
    summary = {side: summarise(r) for side, r in runs.items()}
    print_table(summary)
    result = {"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs, "summary": summary}
    print(json.dumps({side: {k: round(v["median"], 1) for k, v in s.items()} for side, s in summary.items()}))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
