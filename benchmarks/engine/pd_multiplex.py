"""Decode inter-token gaps while long prompts arrive: aggregated chunked prefill vs multiplexed mode.

    python benchmarks/engine/pd_multiplex.py --random-model qwen3-8b            # on the GPU
    python benchmarks/engine/pd_multiplex.py --model DIR --device cpu --streams 2 --long-prompt 64 \\
        --long-count 2 --long-interval-s 0.05 --chunks 32 --rounds 1 --max-model-len 512   # smoke

One process, one model load: every arm is a fresh engine (its own block manager and scheduler) over
the same loaded runner (weights, KV cache tensor, CUDA graphs), so arms differ only in how they
schedule. Arms: `agg-C`, the normal engine with a token budget (chunk) of C per step, and `mux-T`, the
multiplexed engine (prefill chunks of the largest C on SM shares beside the decode steps) holding an
inter-token target of T ms (`--mux-arms`, e.g. `30,10,10:sync,10:noprio`: `sync` without run-ahead
decode steps, `noprio` with decode on the ordinary stream instead of the high-priority one, `parts`
with each chunk launched 4 layers per decode step instead of in one piece, `knee` with the knee split
(`--mux-split knee`: the share stops where a larger one would slow decode), `after` with each new chunk
started after its engine step's decode step (`PDSERVE_MUX_CHUNK_AFTER_DECODE`), `smsN` with every chunk
beside decode on the N-SM share (no controller: one point of the frontier between decode's gaps and
prefill's rate; the shares in use are logged at start-up), `cN` with chunks of N tokens instead of
`--mux-chunk`). Arms run alternated, `--rounds` times each.

A run: `--streams` short requests start and reach decode; then `--long-count` prompts of
`--long-prompt` tokens arrive every `--long-interval-s`. The window runs from the first arrival to
the last long prompt's first token. Reported per arm (all rounds pooled): output tokens/s in the
window, the decode streams' inter-token gaps (p50/p99/max: every gap, not an average), the long
prompts' time to first token (p50/max), the prefill rate (the long prompts' tokens over the window:
with arrivals faster than the share computes, what that share sustains beside decode), and how many
requests met the SLO (`--slo-itl-ms`: every gap
of a stream in the window; `--slo-ttft-ms`: a long prompt's first token), as a share of all of them.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.engine.step_classes import StepClasses, report_classes  # noqa: E402
from common import LLM, SamplingParams  # noqa: E402
from common.core import run_ahead  # noqa: E402
from common.core.percentile import percentile  # noqa: E402
from common.llm_engine import LLMEngine  # noqa: E402
from common.multiplex.controller import ShareController  # noqa: E402
from common.multiplex.partitions import build_partitions  # noqa: E402
from common.multiplex.step_classes import StepClassifier  # noqa: E402
from common.tools.default_model import resolve_model  # noqa: E402
from common.tools.random_model import write_random_model  # noqa: E402

STREAM_PROMPT = 128  # tokens of each decode stream's prompt


@dataclass
class RunStats:
    gaps: list[float] = field(default_factory=list)
    worst_gap: dict[str, float] = field(default_factory=dict)  # per decode stream, in the window
    ttfts: list[float] = field(default_factory=list)
    tokens: int = 0
    seconds: float = 0.0
    classes: StepClasses = field(default_factory=StepClasses)  # the window's steps by what they did


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="HF model dir (default: the default model)")
    p.add_argument("--random-model", default=None, help="a common/tools/random_model.py preset instead")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--streams", type=int, default=16, help="decode streams running throughout")
    p.add_argument("--long-prompt", type=int, default=6000, help="tokens of each arriving long prompt")
    p.add_argument("--long-count", type=int, default=6)
    p.add_argument("--long-interval-s", type=float, default=0.5)
    p.add_argument("--chunks", default="512,2048,8192", help="aggregated arms' token budgets per step")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--mux-chunk", type=int, default=None, help="multiplexed arms' chunk (default: largest)")
    p.add_argument("--mux-arms", default="30", help="multiplexed arms: targets (ms), :sync :noprio :parts")
    p.add_argument("--slo-itl-ms", type=float, default=50.0, help="a stream meets it if every gap does")
    p.add_argument("--slo-ttft-ms", type=float, default=1000.0, help="a long prompt's first token")
    p.add_argument("--max-model-len", type=int, default=None, help="default: the model's limit")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    p.add_argument("--step-classes", action="store_true", help="trace the gaps above p99 to step kinds")
    return p.parse_args(argv)


def load(args: argparse.Namespace, chunks: list[int]) -> LLM:
    model = args.model
    if args.random_model:
        model = str(write_random_model(Path(tempfile.mkdtemp()) / "m", args.random_model))
    return LLM(
        resolve_model(model),
        device=args.device,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        max_num_batched_tokens=max(chunks),  # main() puts the multiplexed chunk among them
        max_num_seqs=max(args.streams + args.long_count, 8),
        gpu_memory_utilization=args.gpu_memory_utilization,
        enable_prefix_caching=False,  # arms share the KV tensor: no cache may outlive its engine
    )


@dataclass(frozen=True)
class MuxArm:
    """One `--mux-arms` entry: the target, flag options, a fixed share (SMs) and a chunk size, if given."""

    target_ms: float
    options: frozenset[str]
    sms: int | None = None
    chunk: int | None = None


def parse_mux_arm(spec: str) -> MuxArm:
    """`10:sync:sms64:c2048` -> MuxArm(10.0, {"sync"}, 64, 2048); ValueError naming `--mux-arms` otherwise."""
    target, *parts = spec.split(":")
    options, numbers = set(), {}
    for part in parts:
        number = re.fullmatch(r"(sms|c)([1-9][0-9]*)", part)
        if number:
            numbers[number[1]] = int(number[2])
        else:
            options.add(part)
    try:
        ms = float(target)
    except ValueError:
        ms = -1.0
    if not ms > 0 or not options <= {"sync", "noprio", "parts", "knee", "after"}:
        raise ValueError(
            f"--mux-arms: {spec!r} is not a target in ms with optional :sync :noprio :parts :knee :after"
            " :smsN :cN"
        )
    return MuxArm(ms, frozenset(options), numbers.get("sms"), numbers.get("c"))


class FixedShare(ShareController):
    """Every chunk beside decode on one lane (the whole device when nothing decodes): no adjustment."""

    def __init__(self, controller: ShareController, lane: int) -> None:
        super().__init__(controller.config)
        self.rung = lane

    def next_lane(self, decoding: bool, behind: bool = False) -> int:
        return self.rung if decoding else self.whole


def lane_of(partitions, sms: int) -> int:
    """The index of the lane with `sms` SMs; ValueError listing the shares in use otherwise."""
    shares = [lane.sms for lane in partitions.lanes]
    if sms not in shares:
        raise ValueError(f"--mux-arms: no {sms}-SM share; the shares in use are {shares[:-1]}")
    return shares.index(sms)


def make_arms(llm: LLM, chunks: list[int], mux_arms: list[str], mux_chunk: int) -> dict[str, object]:
    """Arm name -> a function building a fresh engine for one run over the loaded runner."""
    base, runner = llm.engine.config, llm.engine.runner
    partitions = build_partitions(runner.platform)

    def engine(config, parts=None, options=frozenset(), fixed_lane=None) -> LLMEngine:
        ahead = False if "sync" in options else run_ahead.enabled(config, runner.platform.is_cuda)
        built = LLMEngine(config, llm.engine.model_config, runner, ahead, None, parts)
        if "parts" in options and built.multiplexer is not None:
            built.multiplexer.layers_per_part = 4
        if "after" in options and built.multiplexer is not None:
            built.multiplexer.chunk_after_decode = True
        if fixed_lane is not None and built.multiplexer is not None:
            built.multiplexer.controller = FixedShare(built.multiplexer.controller, fixed_lane)
        return built

    arms: dict[str, object] = {
        f"agg-{c}": (lambda c=c: engine(base.with_overrides(max_num_batched_tokens=c))) for c in chunks
    }
    for spec in mux_arms:
        arm = parse_mux_arm(spec)
        parts = partitions
        if "noprio" in arm.options and hasattr(partitions, "decode_stream"):  # same lanes, no priority
            parts = type(partitions)(partitions.lanes, partitions.gemm_errors, None)
        fixed = None if arm.sms is None else lane_of(partitions, arm.sms)
        config = base.with_overrides(
            pd_multiplex=True,
            itl_target_ms=arm.target_ms,
            max_num_batched_tokens=arm.chunk or mux_chunk,
            mux_split="knee" if "knee" in arm.options else "target",
        )
        arms[f"mux-{spec}"] = lambda c=config, p=parts, o=arm.options, f=fixed: engine(c, p, o, f)
    return arms


def start_streams(
    engine: LLMEngine, streams: int, vocab: int, seed: int
) -> tuple[random.Random, dict[str, float]]:
    """`streams` decode requests (`s0`...) running, each past its first token: the run's random source
    and each stream's last token time."""
    rng = random.Random(seed)
    room = engine.max_model_len - STREAM_PROMPT - 1
    stream = SamplingParams(temperature=0, max_tokens=room, ignore_eos=True)
    for i in range(streams):
        engine.add_request([rng.randrange(vocab) for _ in range(STREAM_PROMPT)], stream, f"s{i}")
    last: dict[str, float] = {}
    while len(last) < streams:  # every stream has its first token: decode is running
        for u in engine.step().updates:
            last[u.seq.request_id] = time.perf_counter()
    return rng, last


def run_once(engine: LLMEngine, args: argparse.Namespace, vocab: int, seed: int) -> RunStats:
    rng, last = start_streams(engine, args.streams, vocab, seed)
    longs = [[rng.randrange(vocab) for _ in range(args.long_prompt)] for _ in range(args.long_count)]
    stats = _window(engine, args, longs, last)
    engine.abort([f"s{i}" for i in range(args.streams)])
    while engine.has_unfinished:
        engine.step()
    return stats


def _window(engine: LLMEngine, args, longs: list[list[int]], last: dict[str, float]) -> RunStats:
    stats, arrived = RunStats(), {}  # arrived: long prompts waiting for their first token
    one = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    start = time.perf_counter()
    sent = 0
    classifier = StepClassifier(engine.multiplexer)
    while len(stats.ttfts) < len(longs):
        now = time.perf_counter()
        while sent < len(longs) and now >= start + sent * args.long_interval_s:
            engine.add_request(longs[sent], one, f"long{sent}")
            arrived[f"long{sent}"] = now
            sent += 1
        began = now
        classifier.before()
        result = engine.step()
        now = time.perf_counter()
        kind = classifier.after(result.num_prefill_tokens)
        stats.classes.add_step(kind, now - began)
        for u in result.updates:
            rid = u.seq.request_id
            stats.tokens += 1
            if rid in last:
                stats.gaps.append(now - last[rid])
                stats.classes.add_gap(kind, now - last[rid])
                stats.worst_gap[rid] = max(stats.worst_gap.get(rid, 0.0), now - last[rid])
                last[rid] = now
            elif rid in arrived:  # its first update is its first token (others may follow in the step)
                stats.ttfts.append(now - arrived.pop(rid))
    stats.seconds = time.perf_counter() - start
    return stats


def met_slo(runs: list[RunStats], itl_s: float, ttft_s: float) -> float:
    """The share of requests (decode streams and long prompts, all runs) that met the SLO."""
    good = sum(g <= itl_s for r in runs for g in r.worst_gap.values())
    good += sum(t <= ttft_s for r in runs for t in r.ttfts)
    total = sum(len(r.worst_gap) + len(r.ttfts) for r in runs)
    return good / total if total else float("nan")


def report(
    results: dict[str, list[RunStats]], slo_itl_ms: float, slo_ttft_ms: float, long_tokens: int
) -> None:
    """One row per arm; `long_tokens`: the prompt tokens of one run's long prompts (the prefill rate)."""
    print(
        f"\n{'arm':<22} {'out tok/s':>10} {'ITL p50':>9} {'ITL p99':>9} {'ITL max':>9} "
        f"{'TTFT p50':>9} {'TTFT max':>9}   (ms) {'prefill tok/s':>13}"
        f"   met SLO (gaps <= {slo_itl_ms:g}, TTFT <= {slo_ttft_ms:g})"
    )
    for arm, runs in results.items():
        gaps = [g for r in runs for g in r.gaps]
        ttfts = [t for r in runs for t in r.ttfts]
        rate = sum(r.tokens for r in runs) / max(sum(r.seconds for r in runs), 1e-9)
        cells = [percentile(gaps, 50), percentile(gaps, 99), max(gaps, default=float("nan"))]
        cells += [percentile(ttfts, 50), max(ttfts, default=float("nan"))]
        met = met_slo(runs, slo_itl_ms / 1e3, slo_ttft_ms / 1e3)
        prefill = long_tokens * len(runs) / max(sum(r.seconds for r in runs), 1e-9)
        row = f"{arm:<22} {rate:>10.1f} " + " ".join(f"{1e3 * c:>9.2f}" for c in cells)
        print(row + f"      {prefill:>13.0f}   {met:>8.1%}")


def main(argv: list[str] | None = None) -> dict[str, list[RunStats]]:
    args = parse_args(argv)
    chunks = [int(c) for c in args.chunks.split(",")]
    mux_arms = args.mux_arms.split(",")
    arm_chunks = [parse_mux_arm(spec).chunk for spec in mux_arms]  # parsed before the model loads
    mux_chunk = args.mux_chunk or max(chunks)
    llm = load(args, [*chunks, mux_chunk, *(c for c in arm_chunks if c)])
    arms = make_arms(llm, chunks, mux_arms, mux_chunk)
    vocab = min(llm.engine.model_config.vocab_size, 100_000)
    results: dict[str, list[RunStats]] = {name: [] for name in arms}
    for r in range(args.rounds):
        for name, build in arms.items():  # alternated: every arm once per round
            engine = build()  # type: ignore[operator]
            stats = run_once(engine, args, vocab, seed=r)
            results[name].append(stats)
            extra = engine.multiplexer.stats if engine.multiplexer is not None else ""
            print(f"round {r} {name}: {stats.tokens} tokens in {stats.seconds:.2f} s {extra}", flush=True)
    report(results, args.slo_itl_ms, args.slo_ttft_ms, args.long_count * args.long_prompt)
    if args.step_classes:
        print("\nsteps of the window by kind (benchmarks/engine/step_classes.py):")
        for arm, runs in results.items():
            tail_from = percentile([g for r in runs for g in r.gaps], 99)
            report_classes(arm, [r.classes for r in runs], tail_from)
    return results


if __name__ == "__main__":
    main()
