"""Speculative decoding: time per output token against no speculation, acceptance, and how many
outputs stay identical to plain decoding.

    python benchmarks/speculative/speculative.py                           # default model, CPU-sized
    python benchmarks/speculative/speculative.py --ks 4 8 --batches 1 8 64 --max-tokens 160 \\
        --dtype bfloat16 --draft-layers 8                              # the H200 run

Workloads (`--workloads`, default all; greedy, `ignore_eos` unless `--stop-at-eos`; the prompt sets
are in `benchmarks/speculative/speculative_prompts.py`): `copy`, edit-and-copy requests whose answer
repeats most of the prompt (rename a variable in a short function and return the code; fix the typos in a
paragraph and return it), `copy-long`, the same requests on texts long enough that the answer copies
for all of a 160-token run, and `free`, free writing (open questions). ms/token = decode wall time
after every sequence has its first token / tokens generated after it, per sequence (batch 1 runs each
prompt alone, in turn). `--stop-at-eos` ends each answer at its end-of-turn and counts the tokens it
really produced: the answer-only speed. `same` = share of sequences whose output equals the k = 0
output token for token (in float32 it must be 1.00; in bf16 a verification step's rows run in a
differently sized batch than plain decode, so near-ties can flip).

`--draft-layers N` also runs the draft-model proposer, with a draft made here from the target: its
first N decoder layers, its embeddings, final norm and head (same tokenizer by construction). The
last lines are the summary, one per copy workload run (best k, n-gram proposer, batch 1):
`speculative <device> copy-heavy b1: N.NNx` (`copy`) and `speculative <device> copy-long b1: N.NNx`,
with ` stop-at-eos` appended under that flag.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.speculative.speculative_prompts import WORKLOADS  # noqa: E402
from common import LLM, SamplingParams  # noqa: E402
from common.spec_decode.draft_proposer import build_draft_proposer  # noqa: E402
from common.spec_decode.proposer_speculator import ProposerSpeculator, measured_clock  # noqa: E402
from common.spec_decode.speculative import NgramProposer, Proposer, SpecStats, SpeculativeConfig  # noqa: E402
from common.tools.chat import build_chat_prompt  # noqa: E402
from common.tools.default_model import resolve_model  # noqa: E402

# The summary line's name of each copy workload (`copy` keeps the name its past figures have).
SUMMARY_NAMES = {"copy": "copy-heavy", "copy-long": "copy-long"}


def prompt_rounds(llm: LLM, texts: list[str], batch: int) -> list[list[list[int]]]:
    """Batches of `batch` chat prompts; a batch smaller than the prompt set runs once per slice of it
    (batch 1 runs every prompt alone), so no single prompt decides a small batch's figure."""
    rendered = [llm.tokenizer.encode(build_chat_prompt(llm.tokenizer, t)) for t in texts]
    rounds = max(1, len(rendered) // batch)
    return [[rendered[(r * batch + i) % len(rendered)] for i in range(batch)] for r in range(rounds)]


def run(
    llm: LLM,
    rounds: list[list[list[int]]],
    proposer: Proposer | None,
    k: int,
    max_tokens: int,
    stop_at_eos: bool,
) -> tuple[float, list[list[int]], ProposerSpeculator | None]:
    """(seconds per output token after the first, per sequence, outputs, the speculator that ran) over
    all rounds, each run with a fresh speculator (its own stats and step clock) proposing up to k
    drafts. With `stop_at_eos` answers end at their end-of-turn, and only the tokens produced count."""
    engine = llm.engine
    speculator = None
    if proposer is not None:
        config = SpeculativeConfig.from_engine(replace(llm.config, num_speculative_tokens=k))
        clock = measured_clock(engine.runner)
        speculator = ProposerSpeculator(
            proposer, config, engine.max_model_len, clock, engine.async_scheduling
        )
    engine.replace_speculator(speculator)
    engine.timings.reset()
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=not stop_at_eos)
    elapsed, outputs = 0.0, []
    for prompts in rounds:
        seqs = [engine.add_request(p, params) for p in prompts]
        while any(s.num_completion_tokens == 0 for s in seqs):
            engine.step()  # prefill: every sequence has its first token
        t0 = time.perf_counter()
        while engine.has_unfinished:
            engine.step()
        elapsed += time.perf_counter() - t0
        outputs += [s.completion_token_ids for s in seqs]
    # A round's time is every one of its sequences' time: per sequence, it produced the mean count.
    after_first = sum(max(0, len(o) - 1) for o in outputs) / len(rounds[0])
    return elapsed / max(after_first, 1), outputs, speculator


def truncated_copy(src: str, dst: Path, num_layers: int) -> str:
    """A draft model: the first `num_layers` decoder layers of `src` with its embeddings, final norm
    and head, in `dst` (config, safetensors, tokenizer files)."""
    from safetensors.torch import load_file, save_file

    config = json.loads((Path(src) / "config.json").read_text())
    if not 0 < num_layers < config["num_hidden_layers"]:
        raise ValueError(f"--draft-layers must be in [1, {config['num_hidden_layers'] - 1}]")
    config["num_hidden_layers"] = num_layers
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "config.json").write_text(json.dumps(config))
    tensors = {}
    for f in sorted(Path(src).glob("*.safetensors")):
        for name, t in load_file(f).items():
            parts = name.split(".")
            if "layers" in parts and int(parts[parts.index("layers") + 1]) >= num_layers:
                continue
            tensors[name] = t
    save_file(tensors, dst / "model.safetensors")
    for f in Path(src).iterdir():
        if f.name.startswith(("tokenizer", "generation_config", "special_tokens")):
            (dst / f.name).write_bytes(f.read_bytes())
    return str(dst)


def proposers(llm: LLM, ks: list[int], draft_dir: str | None) -> list[tuple[str, int, Proposer | None]]:
    engine = llm.engine
    out: list[tuple[str, int, Proposer | None]] = [("-", 0, None)]
    for k in ks:
        out.append(("ngram", k, NgramProposer(SpeculativeConfig())))
    if draft_dir is not None:
        config = replace(llm.config, speculative="draft", draft_model=draft_dir)
        draft = build_draft_proposer(config, engine.model_config, engine.runner, engine.max_model_len)
        out.extend(("draft", k, draft) for k in ks)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--draft-layers", type=int, default=None, help="also run a draft model: first N layers")
    p.add_argument("--verbose", action="store_true", help="print the policy's learned step times per run")
    p.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    p.add_argument("--stop-at-eos", action="store_true", help="end answers at their end-of-turn")
    args = p.parse_args()
    model = resolve_model(args.model)
    # Configured for speculation so the decode graphs have room for verification rows; the baseline
    # runs with the proposer removed.
    llm = LLM(
        model,
        dtype=args.dtype,
        max_num_seqs=max(max(args.batches), 16),
        num_kvcache_blocks=4096,
        # A prompt seen before would prefill only its uncached tail, with other rounding in bf16: every
        # run must start from the same state for `same` to measure speculation alone.
        enable_prefix_caching=False,
        speculative="ngram",
        num_speculative_tokens=max(args.ks),
    )
    with tempfile.TemporaryDirectory() as tmp:
        draft_dir = truncated_copy(model, Path(tmp), args.draft_layers) if args.draft_layers else None
        best = sweep(llm, args, proposers(llm, args.ks, draft_dir))
    device = "H200" if llm.engine.runner.platform.is_cuda else "CPU"
    suffix = " stop-at-eos" if args.stop_at_eos else ""
    for name, speedup in best.items():
        print(f"speculative {device} {SUMMARY_NAMES[name]} b1: {speedup:.2f}x{suffix}")


def sweep(llm: LLM, args, runs: list[tuple[str, int, Proposer | None]]) -> dict[str, float]:
    """Print one row per (workload, batch, proposer, k); returns each copy workload's best batch-1
    n-gram speed-up."""
    print(
        f"{'workload':<9}{'batch':>6}{'proposer':>9}{'k':>3}{'ms/token':>10}{'speedup':>9}"
        f"{'accept':>8}{'tok/step':>9}{'same':>6}"
    )
    best: dict[str, float] = {}
    for name in args.workloads:
        for batch in args.batches:
            prompts = prompt_rounds(llm, WORKLOADS[name], batch)
            run(llm, prompts[:1], None, 0, 4, args.stop_at_eos)  # warm-up
            base, ref, _ = run(llm, prompts, None, 0, args.max_tokens, args.stop_at_eos)
            for kind, k, proposer in runs:
                tpot, outs, speculator = (
                    (base, ref, None)
                    if proposer is None
                    else run(llm, prompts, proposer, k, args.max_tokens, args.stop_at_eos)
                )
                stats = speculator.stats if speculator is not None else SpecStats()
                same = sum(a == b for a, b in zip(outs, ref, strict=True)) / len(ref)
                print(
                    f"{name:<9}{batch:>6}{kind:>9}{k:>3}{tpot * 1e3:>10.2f}{base / tpot:>9.2f}"
                    f"{stats.acceptance_rate:>8.2f}{stats.tokens_per_step:>9.2f}{same:>6.2f}",
                    flush=True,
                )
                clock = speculator.clock if speculator is not None else None
                if args.verbose and clock is not None:
                    plain = {k: round(v * 1e3, 3) for k, v in sorted(clock.plain.items())}
                    verify = {k: round(v * 1e3, 3) for k, v in sorted(clock.verify.items())}
                    steps = llm.engine.timings.decode_steps + llm.engine.timings.prefill_steps
                    print(
                        f"    clock ms plain {plain} verify {verify} host/step "
                        f"{clock.host_per_step * 1e6:.1f} us; verify steps {stats.verify_steps} of {steps}"
                    )
                if name in SUMMARY_NAMES and batch == 1 and kind == "ngram":
                    best[name] = max(best.get(name, 0.0), base / tpot)
    return best


if __name__ == "__main__":
    main()
