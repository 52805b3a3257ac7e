"""How a decode step slows beside a prefill, by where each runs: a probe of the SM split (issue 28).

    python benchmarks/engine/share_probe.py --shape qwen3-8b --rows 64 --prefill-tokens 2048

Weights only (no attention, no model code), so that the figures isolate the split: a "decode step" is
one pass of `rows` token rows through every projection of the shape (the weight read that bounds a
served decode step), captured as a CUDA graph; a "prefill pass" is `prefill-tokens` rows through the
same matrices. For each arm the decode graph is replayed `--replays` times while prefill passes run
back to back on their lane, and the probe prints the decode step's median and p90 (CUDA events) and
the prefill's tokens/s in that window. Arms:

* `solo@N`: decode alone on a green context of N SMs (N = all: a plain stream), nothing beside it;
  how many SMs the weight read needs;
* `prio|P`: decode on a plain stream of the highest priority (multiplexed mode's form), prefill on a
  green context of P SMs;
* `green@N|P`: decode graph captured and replayed on a green context of N SMs, prefill on P: whether
  two green contexts of this torch split the device disjointly (if they overlap, decode slows far
  more than under `prio`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from common.multiplex.green_contexts import green_stream  # noqa: E402

SHAPES = {  # hidden, intermediate, q heads x head_dim, kv heads x head_dim, layers
    "qwen3-8b": (4096, 12288, 4096, 1024, 36),
    "qwen3-0.6b": (1024, 3072, 2048, 1024, 28),
}


_KEEP: list = []  # green contexts of the decode arms: destroying one would destroy its stream


def own_green_stream(sms: int, device: torch.device):
    """A stream on a new green context of `sms` SMs (not the cached one a prefill share uses)."""
    from torch.cuda.green_contexts import GreenContext

    context = GreenContext.create(num_sms=sms, device_id=device.index or 0)
    _KEEP.append(context)
    return context.Stream()


def make_weights(shape: str, device: torch.device) -> list[tuple[torch.Tensor, ...]]:
    hidden, inter, q, kv, layers = SHAPES[shape]
    gen = torch.Generator(device=device).manual_seed(0)

    def w(k: int, n: int) -> torch.Tensor:
        return (torch.randn(k, n, device=device, generator=gen) * 0.02).to(torch.bfloat16)

    return [
        (w(hidden, q + 2 * kv), w(q, hidden), w(hidden, 2 * inter), w(inter, hidden)) for _ in range(layers)
    ]


def forward(x: torch.Tensor, weights: list[tuple[torch.Tensor, ...]]) -> torch.Tensor:
    hidden = x.shape[1]
    for qkv, o, gate_up, down in weights:
        a = x @ qkv
        x = a[:, : o.shape[0]] @ o
        g = x @ gate_up
        x = g[:, : down.shape[0]] @ down
        x = x[:, :hidden]
    return x


def capture(x: torch.Tensor, weights, stream) -> torch.cuda.CUDAGraph:
    with torch.cuda.stream(stream):
        for _ in range(2):
            forward(x, weights)  # warm-up: cuBLAS picks and loads its kernels on this stream
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        forward(x, weights)
    return graph


@dataclass(frozen=True)
class PrefillLoad:
    """`passes` prefill passes of the `x` rows through `weights`, queued on `stream` beside decode."""

    x: torch.Tensor
    weights: list[tuple[torch.Tensor, ...]]
    stream: Any
    passes: int

    @property
    def tokens(self) -> int:
        return self.x.shape[0]


def run_arm(graph, decode_stream, prefill: PrefillLoad | None, replays: int) -> tuple[list[float], float]:
    """Decode step times (ms) and the prefill's tokens/s while they ran (0 without a prefill)."""
    torch.cuda.synchronize()
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(replays + 1)]
    passes: list[torch.cuda.Event] = []
    start = torch.cuda.Event(enable_timing=True)
    start.record(torch.cuda.current_stream())
    if prefill is not None:
        stream = prefill.stream
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(prefill.passes):
                forward(prefill.x, prefill.weights)
                passes.append(torch.cuda.Event(enable_timing=True))
                passes[-1].record(stream)
    decode_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(decode_stream):
        marks[0].record(decode_stream)
        for i in range(replays):
            graph.replay()
            marks[i + 1].record(decode_stream)
    torch.cuda.synchronize()
    ends = [start.elapsed_time(m) for m in marks]
    steps = [ends[i + 1] - ends[i] for i in range(replays)]
    rate = 0.0
    if prefill is not None:
        done = [start.elapsed_time(e) for e in passes]
        inside = [t for t in done if ends[0] <= t <= ends[-1]]
        if len(inside) >= 2:
            rate = (len(inside) - 1) * prefill.tokens / ((inside[-1] - inside[0]) / 1e3)
        # Only the steps that ended while the prefill still ran were beside it: two green contexts of
        # torch 2.11 take turns, so a prefill can finish long before the decode steps queued with it.
        beside = [t for t, end in zip(steps, ends[1:], strict=True) if end <= done[-1]]
        if len(beside) < len(steps):
            print(f"  {len(steps) - len(beside)} of {len(steps)} steps ended after the prefill: not counted")
        steps = beside or steps
    return steps, rate


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-8b")
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--prefill-tokens", type=int, default=2048)
    p.add_argument("--prefill-shares", type=int, nargs="+", default=[32, 64, 96])
    p.add_argument("--replays", type=int, default=60)
    p.add_argument("--prefill-passes", type=int, default=12)
    args = p.parse_args()
    device = torch.device("cuda")
    total = torch.cuda.get_device_properties(device).multi_processor_count
    weights = make_weights(args.shape, device)
    x = torch.randn(args.rows, SHAPES[args.shape][0], device=device).to(torch.bfloat16)
    px = torch.randn(args.prefill_tokens, SHAPES[args.shape][0], device=device).to(torch.bfloat16)
    prio = torch.cuda.Stream(device=device, priority=-100)
    rows: list[tuple[str, list[float], float]] = []

    def arm(name: str, decode_stream, prefill_sms: int | None) -> None:
        graph = capture(x, weights, decode_stream)
        prefill = None
        if prefill_sms is not None:
            _, stream = green_stream(prefill_sms, device)
            prefill = PrefillLoad(px, weights, stream, args.prefill_passes)
        run_arm(graph, decode_stream, prefill, 3)  # warm the pair up
        steps, rate = run_arm(graph, decode_stream, prefill, args.replays)
        rows.append((name, steps, rate))
        print(f"{name}: {statistics.median(steps):.3f} ms, prefill {rate:,.0f} tok/s", flush=True)
        if max(steps) > 1.5 * statistics.median(steps):  # where the slow steps fall in the run
            print("  steps ms: " + " ".join(f"{t:.1f}" for t in steps), flush=True)

    arm(f"solo@{total}", prio, None)
    for sms in sorted({s for s in (32, 64, 96, total - 32, total - 64) if 8 <= s < total}):
        arm(f"solo@{sms}", own_green_stream(sms, device), None)
    for share in args.prefill_shares:
        arm(f"prio|{share}", prio, share)
        rest = (total - share) // 8 * 8
        arm(f"green@{rest}|{share}", own_green_stream(rest, device), share)
    print(f"\n{args.shape}, {args.rows} decode rows, prefill of {args.prefill_tokens} tokens, {total} SMs")
    print("| arm | decode step p50 / p90 ms | prefill tok/s |\n| --- | --- | --- |")
    for name, steps, rate in rows:
        q = sorted(steps)
        print(f"| {name} | {statistics.median(q):.3f} / {q[int(0.9 * (len(q) - 1))]:.3f} | {rate:,.0f} |")


if __name__ == "__main__":
    main()
