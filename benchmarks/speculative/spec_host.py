"""Host time of speculative decoding on the CPU: what a verifying step spends outside the model
forward, per phase, in microseconds per verified row (and per plain step, for the proposer's cost
when nothing verifies).

    python benchmarks/speculative/spec_host.py [--ks 4 8] [--batches 1 8] [--max-tokens 160] [--repeats 3]

A tiny random model (its forward is excluded anyway) decodes random prompts greedily, with run-ahead
on and the GPU's policy: a step clock with flat step costs (a launch-bound device, where verifying
pays) that does not learn from the CPU's own step times. The drafts replay the known answer with
wrong tokens at a fixed rate (`ReplayProposer`: copy-heavy text's draft lengths and acceptance; the
n-gram index still runs and is timed). Phases are timed by wrapping the engine's functions,
inclusive of what they call (indented rows are part of the row above). `graph fill` is the
CUDA-graph path's input preparation, which the CPU does not run: it is timed aside, on each
verifying batch, next to the CPU's eager `prepare_step`. Each phase shows its least time over
`--repeats` runs of the same work (the box's load only ever adds); compare runs made one after the
other.
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

import numpy as np  # noqa: E402

from common import LLM, SamplingParams
from common.core import scheduler
from common.llm_engine import LLMEngine  # noqa: E402
from common.runner import graph_inputs, model_runner  # noqa: E402
from common.runner.graph_inputs import graph_rows  # noqa: E402
from common.runner.model_runner import ModelRunner  # noqa: E402
from common.runner.sampler import Sampler  # noqa: E402
from common.runner.step_costs import StepCosts  # noqa: E402
from common.runner.step_handle import StepHandle  # noqa: E402
from common.spec_decode import proposer_speculator, speculative  # noqa: E402
from common.spec_decode.proposer_speculator import ProposerSpeculator  # noqa: E402
from common.spec_decode.step_clock import StepClock  # noqa: E402

# (phase, depth): report order; a deeper row is part of the shallower one above it.
PHASES = [
    ("step (host)", 0),
    ("may_speculate", 1),
    ("update_from_output (plain)", 1),
    ("schedule", 1),
    ("speculator.plan", 2),
    ("propose (n-gram)", 3),
    ("choose_drafts", 3),
    ("launch (host)", 1),
    ("prepare_step (eager)", 2),
    ("prepare_sampling", 2),
    ("sampler", 2),
    ("StepHandle.result", 1),
    ("update_from_output (verify)", 1),
    ("accept_drafts", 2),
    ("graph fill (GPU path, aside)", 0),
]
FORWARD = "model forward"
_PROMPTS = 8


class FrozenClock(StepClock):
    """A GPU-like clock that keeps its given costs (the CPU's step times would teach it the CPU)."""

    def observe(self, verify: bool, rows: int, seconds: float) -> None:
        pass


class Phases:
    """Inclusive seconds per phase, per step, then filed under the step's kind (verify or plain)."""

    def __init__(self) -> None:
        self.step: dict[str, float] = defaultdict(float)
        self.totals = {kind: defaultdict(float) for kind in ("verify", "plain")}
        self.steps = {"verify": 0, "plain": 0}
        self.rows = 0  # rows of verifying steps

    def add(self, phase: str, seconds: float) -> None:
        self.step[phase] += seconds

    def wrap(self, owner, name: str, phase, patches: list) -> None:
        """Time `owner.name`; `phase` is a name or a function of the call's arguments giving one."""
        original = getattr(owner, name)
        patches.append((owner, name, original))

        @functools.wraps(original)
        def timed(*args, **kwargs):
            label = phase(*args, **kwargs) if callable(phase) else phase
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.add(label, time.perf_counter() - t0)

        setattr(owner, name, timed)

    @staticmethod
    def fastest(runs: list[Phases]) -> Phases:
        """Each phase's least time over runs of the same work (the box's noise only ever adds)."""
        best = runs[0]
        for kind, totals in best.totals.items():
            for phase in totals:
                totals[phase] = min(r.totals[kind][phase] for r in runs)
        return best

    def end_step(self, verify_rows: int) -> None:
        kind = "verify" if verify_rows else "plain"
        self.steps[kind] += 1
        self.rows += verify_rows
        for phase, seconds in self.step.items():
            self.totals[kind][phase] += seconds
        self.step = defaultdict(float)


def _update_label(sched, seqs, *_args, **_kw) -> str:
    return (
        "update_from_output (verify)"
        if any(s.num_draft_tokens for s in seqs)
        else "update_from_output (plain)"
    )


def instrument(phases: Phases) -> list:
    """Wrap the engine's phases; returns the patches to undo."""
    patches: list = []
    w = phases.wrap
    w(ProposerSpeculator, "may_speculate", "may_speculate", patches)
    w(ProposerSpeculator, "plan", "speculator.plan", patches)
    w(speculative.NgramProposer, "draft", "propose (n-gram)", patches)
    w(proposer_speculator, "choose_drafts", "choose_drafts", patches)
    w(scheduler.Scheduler, "schedule", "schedule", patches)
    w(scheduler.Scheduler, "update_from_output", _update_label, patches)
    w(ProposerSpeculator, "accept", "accept_drafts", patches)
    w(model_runner, "prepare_step", "prepare_step (eager)", patches)
    w(model_runner, "prepare_sampling", "prepare_sampling", patches)
    w(Sampler, "__call__", "sampler", patches)
    w(ModelRunner, "launch", "launch (host)", patches)
    w(ModelRunner, "_forward", FORWARD, patches)
    w(StepHandle, "result", "StepHandle.result", patches)
    _wrap_step(phases, patches)
    return patches


def _wrap_step(phases: Phases, patches: list) -> None:
    original = LLMEngine.step
    patches.append((LLMEngine, "step", original))
    fill = GraphFill()

    def step(engine):
        t0 = time.perf_counter()
        batch = []
        schedule = engine.scheduler.schedule

        def capture():
            batch.append(schedule())
            if batch[0].num_draft_tokens:
                phases.add("graph fill (GPU path, aside)", fill.time(batch[0].seqs))
            return batch[0]

        engine.scheduler.schedule = capture
        try:
            return original(engine)
        finally:
            del engine.scheduler.schedule
            aside = phases.step[FORWARD] + phases.step["graph fill (GPU path, aside)"]
            phases.add("step (host)", time.perf_counter() - t0 - aside)
            phases.step["launch (host)"] -= phases.step[FORWARD]
            verify = batch[0].num_decode_tokens if batch and batch[0].num_draft_tokens else 0
            phases.end_step(verify)

    LLMEngine.step = step


class GraphFill:
    """The decode graphs' host-side step preparation (`prepare_rows`) into numpy views like the
    pinned buffer's, for the batches the CPU runs eagerly."""

    def __init__(self, max_rows: int = 512, width: int = 256, block_size: int = 16) -> None:
        buf = np.zeros(graph_inputs.packed_size(max_rows, width), dtype=np.int32)
        self.views = graph_inputs.RowViews.over(buf, max_rows, width)
        self.sizes, self.block_size = graph_inputs.capture_sizes(max_rows), block_size

    def time(self, seqs) -> float:
        t0 = time.perf_counter()
        q_lens = graph_inputs.query_lens(seqs, self.sizes[-1])
        if q_lens is not None:
            bs = next(s for s in self.sizes if s >= sum(q_lens))
            graph_inputs.prepare_rows(self.views, seqs, q_lens, bs, None, self.block_size)
        return time.perf_counter() - t0


class ReplayProposer(speculative.NgramProposer):
    """N-gram lookup runs (and is timed) as usual, but the drafts proposed are the known greedy
    answer's next tokens, each replaced by a wrong one with probability 1 - `acceptance`: a random
    model does not copy its prompt, and this gives copy-heavy text's draft lengths instead."""

    def __init__(self, k: int, answers: dict, acceptance: float) -> None:
        super().__init__(speculative.SpeculativeConfig(k))
        rng = random.Random(k)
        # Drafts as the answer with wrong tokens in fixed places, looked up per sequence once.
        self.drafts = {
            prompt: [t if rng.random() < acceptance else (t + 1) % 512 for t in answer]
            for prompt, answer in answers.items()
        }
        self.by_seq: dict[int, list[int]] = {}

    def draft(self, seq, room: int) -> list[int]:
        super().draft(seq, room)
        drafts = self.by_seq.get(seq.seq_id)
        if drafts is None:
            drafts = self.by_seq[seq.seq_id] = self.drafts[tuple(seq.prompt_token_ids)]
        done = seq.num_completion_tokens
        return drafts[done : done + room]


def answers(llm: LLM, n: int, seed: int, length: int) -> dict[tuple[int, ...], list[int]]:
    """Random prompts and their greedy answers (the engine without speculation)."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(512) for _ in range(rng.randint(100, 300))] for _ in range(n)]
    llm.engine.replace_speculator(None)
    greedy = SamplingParams(temperature=0, max_tokens=length, ignore_eos=True)
    outs = llm.generate(prompts, greedy, use_tqdm=False)
    return {tuple(p): o["token_ids"] for p, o in zip(prompts, outs, strict=True)}


def measure(llm: LLM, k: int, batch: int, max_tokens: int, acceptance: float) -> Phases:
    """Phases of decoding `batch` copy-heavy prompts at once with k drafts (after a warm-up)."""
    engine = llm.engine
    known = answers(llm, _PROMPTS, seed=k, length=max_tokens)
    prompts = [list(p) for p in known]
    sizes = graph_inputs.capture_sizes(graph_rows(llm.config))
    clock = FrozenClock(StepCosts(tuple(sizes), tuple(1e-3 * (1.0 + s / 512) for s in sizes)))
    speculator = ProposerSpeculator(
        ReplayProposer(k, known, acceptance),
        speculative.SpeculativeConfig(k),
        engine.max_model_len,
        clock,
        run_ahead=engine.async_scheduling,
    )
    engine.replace_speculator(speculator)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate(prompts[:batch], params, use_tqdm=False)  # warm-up
    speculator.stats = speculative.SpecStats()  # count the measured runs only
    phases = Phases()
    patches = instrument(phases)
    try:
        for start in range(0, _PROMPTS, batch):  # batch 1 runs every prompt alone, in turn
            llm.generate(prompts[start : start + batch], params, use_tqdm=False)
    finally:
        for owner, name, original in reversed(patches):
            setattr(owner, name, original)
    phases.stats = speculator.stats
    return phases


def report(phases: Phases, k: int, batch: int) -> None:
    v, p = phases.totals["verify"], phases.totals["plain"]
    rows, nv, npl = max(phases.rows, 1), phases.steps["verify"], max(phases.steps["plain"], 1)
    print(
        f"k={k} batch={batch}: {nv} verifying steps ({phases.rows / max(nv, 1):.1f} rows each), "
        f"{phases.steps['plain']} plain steps; forward {1e6 * v[FORWARD] / max(nv, 1):.0f} us per "
        f"verifying step (excluded)"
    )
    print(f"  {'phase':<34}{'us/verified row':>16}{'us/plain step':>15}")
    for name, depth in PHASES:
        print(f"  {'  ' * depth + name:<34}{1e6 * v[name] / rows:>16.1f}{1e6 * p[name] / npl:>15.1f}")
    gpu_path = v["step (host)"] - v["prepare_step (eager)"] + v["graph fill (GPU path, aside)"]
    print(f"  {'GPU path: step - eager + fill':<34}{1e6 * gpu_path / rows:>16.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ks", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--acceptance", type=float, default=0.7, help="chance that each draft is right")
    ap.add_argument("--repeats", type=int, default=3, help="runs per case; each phase's fastest is shown")
    args = ap.parse_args()
    from common.tools.tiny_models import write_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model = str(write_tiny_model("llama", Path(tmp) / "llama"))
        llm = LLM(
            model,
            num_kvcache_blocks=1024,
            max_num_seqs=max(max(args.batches), 16),
            speculative="ngram",
            num_speculative_tokens=max(args.ks),
            async_scheduling=True,
            enable_prefix_caching=False,
        )
        for k in args.ks:
            for batch in args.batches:
                runs = [measure(llm, k, batch, args.max_tokens, args.acceptance) for _ in range(args.repeats)]
                report(Phases.fastest(runs), k, batch)
                s = runs[0].stats
                print(f"  acceptance {s.acceptance_rate:.2f}, tokens per verify {s.tokens_per_step:.2f}")


if __name__ == "__main__":
    main()
