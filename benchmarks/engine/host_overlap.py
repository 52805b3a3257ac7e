"""Is the host hidden behind the GPU? Decode-phase host time, GPU busy time and wall time per step.

    python benchmarks/engine/host_overlap.py --model DIR [--batches 1 64 256] [--context 1000] [--steps 256]

For each batch size: that many prompts of `--context` random tokens are prefilled first (not timed),
then `--steps` decode steps run to the end (ignore_eos, every sequence stopping at a length drawn in
[steps/2, steps] so sequences finish along the way, as in a real workload). Reported per decode step:
wall time, host time (the engine's step time minus the time it blocked on the device,
`StepTimings.device_wait`) and, from a second, profiled run of the same steps, GPU busy time (the
union of kernel intervals). `idle` = 1 - busy / wall: the share of the decode phase in which the GPU
waited for the host. Run-ahead hides the host when host time per step < GPU time per step.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from benchmarks.engine.offline_profile import busy_us  # noqa: E402
from common import LLM, SamplingParams  # noqa: E402

_CUDA = torch.autograd.DeviceType.CUDA


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _busy_us(prof) -> float:
    return busy_us([(e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == _CUDA])


def _decode_phase(llm: LLM, batch: int, args, profiled: bool) -> dict:
    rng = random.Random(batch)
    engine = llm.engine
    vocab = min(10000, engine.runner.model_config.vocab_size)
    for _ in range(batch):
        n = rng.randint(args.steps // 2, args.steps)
        params = SamplingParams(temperature=args.temperature, ignore_eos=True, max_tokens=n)
        engine.add_request([rng.randrange(vocab) for _ in range(args.context)], params)
    seqs = list(engine.scheduler.waiting)
    while any(s.num_completion_tokens == 0 for s in seqs):  # prefill (and admission) first
        engine.step()
    _sync()
    engine.timings.reset()
    prof = profile(activities=[ProfilerActivity.CUDA]) if profiled else None
    if prof is not None:
        prof.__enter__()
    t0 = time.perf_counter()
    while engine.has_unfinished:
        engine.step()
    _sync()
    wall = time.perf_counter() - t0
    if prof is not None:
        prof.__exit__(None, None, None)
    tm = engine.timings
    steps = max(tm.decode_steps, 1)
    spent = tm.schedule + tm.decode_forward + tm.prefill_forward + tm.postprocess
    return {
        "wall_ms": 1e3 * wall / steps,
        "host_ms": 1e3 * (spent - getattr(tm, "device_wait", 0.0)) / steps,
        "busy_ms": _busy_us(prof) / 1e3 / steps if prof is not None else None,
        "steps": tm.decode_steps,
        "drains": dict(getattr(tm, "drains", {})),
    }


def measure(llm: LLM, batch: int, args) -> dict:
    """The plain run's figures, with GPU busy time from a profiled run of the same steps (CUDA only)."""
    plain = _decode_phase(llm, batch, args, profiled=False)
    plain["idle"] = None
    if torch.cuda.is_available():
        profiled = _decode_phase(llm, batch, args, profiled=True)
        plain["busy_ms"] = profiled["busy_ms"]
        plain["idle"] = 1 - profiled["busy_ms"] / profiled["wall_ms"]
    return {"batch": batch, **plain}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256])
    p.add_argument("--context", type=int, default=1000)
    p.add_argument("--steps", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--json-out", default=None)
    p.add_argument("--engine-kwargs", default="{}", help="JSON of extra LLM(...) arguments")
    args = p.parse_args()
    kwargs = {"max_num_seqs": max(args.batches), "max_model_len": args.context + args.steps + 8}
    llm = LLM(args.model, **{**kwargs, **json.loads(args.engine_kwargs)})
    warm = [[1, 2, 3]] * 4
    llm.generate(warm, [SamplingParams(max_tokens=8)] * 4, use_tqdm=False)
    rows = [measure(llm, b, args) for b in args.batches]
    print("batch  wall ms/step  host ms/step  GPU busy ms/step  GPU idle  drains")
    for r in rows:
        busy = "-" if r["busy_ms"] is None else f"{r['busy_ms']:.3f}"
        idle = "-" if r["idle"] is None else f"{100 * r['idle']:.1f}%"
        print(
            f"{r['batch']:5d}  {r['wall_ms']:12.3f}  {r['host_ms']:12.3f}  {busy:>16}  {idle:>8}"
            f"  {r['drains']}"
        )
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
