"""Host time of a plain run-ahead decode step on the CPU, per phase, at batch 1, 64 and 256.

    python benchmarks/engine/decode_host.py [--batches 1 64 256] [--context 1000] [--steps 64] [--repeats 3]

The GPU hides the host's part of a decode step behind the step in flight only while that part is
shorter than the GPU's step (on the H200 with Qwen3-0.6B shapes at 1,000 tokens of context: 0.81 ms
at 1 row, 2.2 ms at 64, 6.3 ms at 256; docs/benchmarks-log.md). This measures the host's part where the
model's cost is irrelevant: a tiny random model decodes `batch` prompts of `--context` tokens with
run-ahead forced on and T=0.6 (so the sampler takes its sampling path), and the engine's phases are
timed by wrapping its functions. Excluded, because the GPU path does not run them: the eager step
(`ModelRunner._run_eager`: input tensors, the forward pass) and the sampler's own arithmetic (on the
GPU it is device work, its host part the launch of about ten torch ops). Included aside: `graph
fill`, the CUDA-graph path's host-side input preparation (`graph_inputs.prepare_rows` into numpy views
like the pinned buffer's), timed on each step's batch. Each phase shows its least time over
`--repeats` runs.
"""

from __future__ import annotations

import argparse
import functools
import random
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.speculative.spec_host import GraphFill  # noqa: E402
from common import LLM, SamplingParams
from common.core import (
    run_ahead,
    scheduler,  # noqa: E402
)
from common.llm_engine import LLMEngine  # noqa: E402
from common.runner import model_runner  # noqa: E402
from common.runner.model_runner import ModelRunner  # noqa: E402
from common.runner.sampler import Sampler  # noqa: E402

# Phases the GPU path runs on the host, then the ones excluded from the total (CPU-only or device work).
HOST_PHASES = ("schedule", "update_from_output", "prepare_sampling", "run_ahead.start", "graph fill")
EXCLUDED = ("eager step (CPU path)", "sampler")


class Timer:
    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self.steps = 0

    def wrap(self, owner, name: str, label: str, patches: list) -> None:
        original = getattr(owner, name)
        patches.append((owner, name, original))

        @functools.wraps(original)
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.totals[label] += time.perf_counter() - t0

        setattr(owner, name, timed)


def instrument(timer: Timer, block_size: int) -> list:
    patches: list = []
    timer.wrap(scheduler.Scheduler, "schedule", "schedule", patches)
    timer.wrap(scheduler.Scheduler, "update_from_output", "update_from_output", patches)
    timer.wrap(model_runner, "prepare_sampling", "prepare_sampling", patches)
    timer.wrap(run_ahead, "start", "run_ahead.start", patches)
    timer.wrap(ModelRunner, "_run_eager", "eager step (CPU path)", patches)
    timer.wrap(Sampler, "__call__", "sampler", patches)
    original_step, fill = LLMEngine.step, GraphFill(max_rows=512, width=256, block_size=block_size)
    patches.append((LLMEngine, "step", original_step))
    original_launch = ModelRunner.launch
    patches.append((ModelRunner, "launch", original_launch))

    def launch(runner, seqs, is_decode, src_rows=None):
        if is_decode:
            timer.totals["graph fill"] += fill.time(seqs)
        return original_launch(runner, seqs, is_decode, src_rows)

    def step(engine):
        t0 = time.perf_counter()
        try:
            return original_step(engine)
        finally:
            timer.totals["step"] += time.perf_counter() - t0
            timer.steps += 1

    ModelRunner.launch, LLMEngine.step = launch, step
    return patches


def measure(llm: LLM, batch: int, args) -> Timer:
    rng = random.Random(batch)
    engine = llm.engine
    params = SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=args.steps)
    seqs = [
        engine.add_request([rng.randrange(512) for _ in range(args.context)], params) for _ in range(batch)
    ]
    while any(s.num_completion_tokens == 0 for s in seqs):  # prefill first, untimed
        engine.step()
    timer = Timer()
    patches = instrument(timer, llm.config.kvcache_block_size)
    try:
        while engine.has_unfinished:
            engine.step()
    finally:
        for owner, name, original in reversed(patches):
            setattr(owner, name, original)
    return timer


def report(runs: list[Timer], batch: int) -> dict:
    steps = max(runs[0].steps, 1)  # the same work in every run
    best = {k: min(r.totals[k] for r in runs) / steps for k in runs[0].totals}
    glue = best["step"] - sum(best.get(k, 0.0) for k in (*HOST_PHASES, *EXCLUDED))  # all timed inside step
    total = glue + sum(best.get(k, 0.0) for k in HOST_PHASES)
    print(f"batch {batch}: {runs[0].steps} steps; host us per step (GPU path) = {1e6 * total:.0f}")
    for k in HOST_PHASES:
        print(f"  {k:<22}{1e6 * best.get(k, 0.0):9.1f}")
    print(f"  {'engine glue':<22}{1e6 * glue:9.1f}")
    return {
        "batch": batch,
        "host_us": 1e6 * total,
        **{k: 1e6 * v for k, v in best.items()},
        "glue": 1e6 * glue,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--context", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from common.tools.tiny_models import write_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        room = args.context + args.steps + 1
        model = str(write_tiny_model("llama", Path(tmp) / "llama", max_position_embeddings=room))
        blocks = max(args.batches) * ((args.context + args.steps) // args.block_size + 2)
        llm = LLM(
            model,
            num_kvcache_blocks=blocks,
            kvcache_block_size=args.block_size,
            max_num_seqs=max(args.batches),
            max_num_batched_tokens=max(args.batches) * args.context,
            max_model_len=room,
            async_scheduling=True,
        )
        for batch in args.batches:
            report([measure(llm, batch, args) for _ in range(args.repeats)], batch)


if __name__ == "__main__":
    main()
