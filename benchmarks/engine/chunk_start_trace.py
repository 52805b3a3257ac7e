"""What the decode steps beside a new prefill chunk overlap on the device (issue 28's ITL tail).

    python benchmarks/engine/chunk_start_trace.py --model DIR --streams 64 --arm 30:sms64:sync --out DIR

`pd_multiplex.py --step-classes` found the first decode step beside a newly launched chunk ~1.45x
slower than the later ones. This runs one multiplexed engine (`--arm`, a `pd_multiplex.py --mux-arms`
entry), starts `--streams` decode streams, queues `--long-count` long prompts at once (chunks launch
back to back) and records `--steps` engine steps with the profiler. From the trace: each decode step
on the device (the kernels of one CUDA-graph launch on the decode stream) with its span, its kernels'
busy time and the prefill lane's kernel time inside that span; the steps whose span holds the start of
a chunk (its lane's first kernel after an idle lane) marked `start`; then per decode kernel name, its
mean time in `start` steps against the later ones (the kernels that slow down), and the same for the
lane's kernels inside the steps (what the chunk runs meanwhile). The chrome trace is kept
in `--out` (gzip). On a machine without CUDA there are no device kernels: it says so and stops.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import statistics
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from benchmarks.engine import pd_multiplex  # noqa: E402
from common import SamplingParams  # noqa: E402

LANE_IDLE_US = 2_000.0  # a lane kernel after this long without one starts a new chunk


@dataclass
class DecodeStep:
    """One decode graph launch on the device: its span (us), its kernels and the lane time inside it."""

    start: float
    end: float
    kernels: dict[str, float] = field(default_factory=dict)  # decode kernel name -> us in the step
    lane_us: float = 0.0
    lane_kernels: dict[str, float] = field(default_factory=dict)  # lane kernel name -> us inside the span
    chunk_start: bool = False

    @property
    def span_ms(self) -> float:
        return (self.end - self.start) / 1e3


def kernel_events(trace: dict) -> list[dict]:
    return [e for e in trace.get("traceEvents", []) if e.get("cat") == "kernel" and "dur" in e]


def decode_steps(kernels: list[dict]) -> list[DecodeStep]:
    """Decode steps from a trace's kernels: the stream with the most kernels is the decode stream (it
    runs every step), one step per launch (correlation id) there; every other stream is a lane."""
    by_stream: dict[int, list[dict]] = defaultdict(list)
    for k in kernels:
        by_stream[k["args"].get("stream", -1)].append(k)
    if not by_stream:
        return []
    decode_stream = max(by_stream, key=lambda s: len(by_stream[s]))
    launches: dict[int, list[dict]] = defaultdict(list)
    for k in by_stream.pop(decode_stream):
        launches[k["args"].get("correlation", -1)].append(k)
    steps = []
    for ks in launches.values():
        step = DecodeStep(min(k["ts"] for k in ks), max(k["ts"] + k["dur"] for k in ks))
        for k in ks:
            step.kernels[k["name"]] = step.kernels.get(k["name"], 0.0) + float(k["dur"])
        steps.append(step)
    steps.sort(key=lambda s: s.start)
    lane = sorted((k for ks in by_stream.values() for k in ks), key=lambda k: k["ts"])
    _mark_lane_time(steps, lane)
    return steps


def _mark_lane_time(steps: list[DecodeStep], lane: list[dict]) -> None:
    """Each step's overlap with lane kernels, and `chunk_start` on the step whose span holds (or first
    follows) a chunk's first lane kernel."""
    last_end = float("-inf")
    for k in lane:
        begin, end = k["ts"], k["ts"] + k["dur"]
        if begin - last_end > LANE_IDLE_US:
            first = next((s for s in steps if s.end > begin), None)
            if first is not None:
                first.chunk_start = True
        last_end = max(last_end, end)
        for s in steps:
            if s.start < end and begin < s.end:
                inside = min(end, s.end) - max(begin, s.start)
                s.lane_us += inside
                s.lane_kernels[k["name"]] = s.lane_kernels.get(k["name"], 0.0) + inside


def report(steps: list[DecodeStep], top: int = 10) -> None:
    starts = [s for s in steps if s.chunk_start]
    others = [s for s in steps if not s.chunk_start and s.lane_us > 0]
    print(f"{'step':>4} {'span ms':>8} {'busy ms':>8} {'lane ms':>8}  mark")
    for i, s in enumerate(steps):
        busy, mark = sum(s.kernels.values()) / 1e3, "start" if s.chunk_start else ""
        print(f"{i:>4} {s.span_ms:>8.2f} {busy:>8.2f} {s.lane_us / 1e3:>8.2f}  {mark}")
    for name, group in (("chunk start", starts), ("beside, later", others)):
        if group:
            spans = [s.span_ms for s in group]
            print(f"{name:<14} {len(group):>3} steps, span p50 {statistics.median(spans):.2f} ms")
    if not starts or not others:
        return
    decode = [s.kernels for s in starts], [s.kernels for s in others]
    lane = [s.lane_kernels for s in starts], [s.lane_kernels for s in others]
    _compare("decode kernels", _mean_per_name(decode[0]), _mean_per_name(decode[1]), top)
    _compare("lane kernels inside", _mean_per_name(lane[0]), _mean_per_name(lane[1]), top)


def _compare(what: str, at_start: dict[str, float], later: dict[str, float], top: int) -> None:
    """The names whose mean time per step grows most from the later steps to the chunk-start steps."""
    print(f"\n{what}, mean us per step: chunk start vs beside later (top {top} by growth)")
    for n in sorted(at_start, key=lambda n: later.get(n, 0.0) - at_start[n])[:top]:
        print(f"  {at_start[n]:>9.1f} {later.get(n, 0.0):>9.1f}  {n[:100]}")


def _mean_per_name(per_step: list[dict[str, float]]) -> dict[str, float]:
    """Mean us per step of each kernel name, from each step's us per name."""
    total: dict[str, float] = defaultdict(float)
    for step in per_step:
        for name, us in step.items():
            total[name] += us
    return {n: t / len(per_step) for n, t in total.items()}


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arm", default="30:sms64:sync", help="one pd_multiplex.py --mux-arms entry")
    p.add_argument("--steps", type=int, default=120, help="engine steps recorded")
    p.add_argument("--out", default=None, help="directory for the gzipped chrome trace")
    return p.parse_known_args(argv)  # the rest are pd_multiplex.py's (model, streams, long prompts)


def main(argv: list[str] | None = None) -> list[DecodeStep]:
    args, rest = parse_args(argv)
    bench = pd_multiplex.parse_args(rest)
    chunk = bench.mux_chunk or max(int(c) for c in bench.chunks.split(","))
    llm = pd_multiplex.load(bench, [chunk])
    engine = pd_multiplex.make_arms(llm, [], [args.arm], chunk)[f"mux-{args.arm}"]()  # type: ignore[operator]
    vocab = min(llm.engine.model_config.vocab_size, 100_000)
    pd_multiplex.start_streams(engine, bench.streams, vocab, seed=0)
    one = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    for i in range(bench.long_count):
        engine.add_request([(7 * i + j) % vocab for j in range(bench.long_prompt)], one, f"long{i}")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            engine.step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            with path.open("rb") as src, gzip.open(Path(args.out) / "chunk_start_trace.json.gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
    steps = decode_steps(kernel_events(trace))
    if not steps:
        print("no device kernels in the trace (no CUDA here): nothing to report")
        return steps
    report(steps)
    return steps


if __name__ == "__main__":
    main()
