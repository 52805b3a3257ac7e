"""The fp8 KV cache against the bf16 cache on a real model (GPU): greedy agreement, decode TPOT, throughput.

    python benchmarks/engine/fp8_parity.py [--model DIR] [--max-tokens 128] [--num-seqs 256] [--json-out F]
    python benchmarks/engine/fp8_parity.py --prompts 2 --max-tokens 8 --skip-speed      # a smoke run (CPU)

Agreement: the chat prompts below, each alone, greedy, `--max-tokens` tokens (ignore_eos), once with
`kv_cache_dtype="auto"` (the model's bf16) and once with `"fp8"`, CUDA graphs on. It prints the share of
prompts whose outputs are token-identical, the median (and each) first-divergence position of the rest,
and the bf16 run's top-2 logit gap there (a near tie has a small gap; fp8 error flipping a confident
token would show a large one), as fp32_parity.py does for bf16 against fp32.

Speed, each arm: decode TPOT at batch 1 and 64 at `--context` tokens (latency.py's `decode_tpot`) and the
offline throughput of offline.py's standard workload (`make_workload` / `run_engine`, `--num-seqs`
prompts, temperature 0.6).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from benchmarks.engine.fp32_parity import QUESTIONS  # noqa: E402
from benchmarks.engine.latency import decode_tpot  # noqa: E402
from benchmarks.engine.offline import make_workload, run_engine  # noqa: E402
from common import LLM, SamplingParams  # noqa: E402
from common.tokenizer import load_tokenizer  # noqa: E402
from common.tools.default_model import resolve_model  # noqa: E402

MORE_QUESTIONS = [
    "Explain photosynthesis in two sentences.",
    "What is the boiling point of water at sea level?",
    "List three uses of a paperclip.",
    "Who wrote Romeo and Juliet?",
    "Translate 'good morning' into French.",
    "Why is the sky blue?",
    "Suggest a name for a pet goldfish.",
    "What does a CPU do?",
    "Describe a rainy day in one sentence.",
    "How do you make a cup of tea?",
    "What is the largest planet in the solar system?",
    "Give two reasons to exercise.",
    "What is a prime number?",
    "Write a short motto for a library.",
    "How many days are in a leap year?",
    "What is the difference between weather and climate?",
    "Name a famous painting and its painter.",
    "What is gravity?",
    "Recommend a book for a long flight.",
    "Summarise the story of Cinderella.",
    "What are the three states of matter?",
    "How does a rainbow form?",
    "Write a limerick about a cat.",
    "What is the square root of 144?",
    "Give one tip for a job interview.",
    "What causes the seasons on Earth?",
]
ARMS = ("auto", "fp8")


def chat_prompts(model: str) -> list[list[int]]:
    tok = load_tokenizer(model)
    chats = [[{"role": "user", "content": q}] for q in QUESTIONS + MORE_QUESTIONS]
    return [tok.encode(tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True)) for c in chats]


def _release() -> None:
    """Give the last engine's memory back to the driver. Call it after the function that held the
    engine has returned: the next engine sizes its KV cache from the driver's free memory, which
    still counts torch's cached blocks while anything references them."""
    gc.collect()
    torch.cuda.empty_cache()


def greedy_runs(
    model: str, prompts, kv_cache_dtype: str, max_tokens: int
) -> list[tuple[list[int], list[float]]]:
    """Each prompt alone: its greedy tokens and each step's gap between its top two logits."""
    llm = LLM(model, kv_cache_dtype=kv_cache_dtype, max_model_len=4096)
    gaps: list[float] = []
    sample = llm.engine.runner.sampler.__call__

    def recording(logits, batch):
        top = torch.topk(logits.float(), 2).values
        gaps.extend((top[:, 0] - top[:, 1]).tolist())
        return sample(logits, batch)

    llm.engine.runner.sampler = recording
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    out = []
    for p in prompts:
        gaps.clear()
        tokens = llm.generate([p], params, use_tqdm=False)[0]["token_ids"]
        out.append((tokens, list(gaps)))
    llm.close()
    return out


def divergence_stats(ref, got) -> dict:
    firsts, gaps = [], []
    for (ref_tokens, ref_gaps), (tokens, _) in zip(ref, got, strict=True):
        first = next((i for i, (a, b) in enumerate(zip(ref_tokens, tokens, strict=True)) if a != b), None)
        firsts.append(first)
        if first is not None:
            gaps.append(ref_gaps[first])
    parted = [f for f in firsts if f is not None]
    return {
        "prompts": len(firsts),
        "identical": len(firsts) - len(parted),
        "median_first_divergence": statistics.median(parted) if parted else None,
        "first_divergences": firsts,
        "median_top2_gap_at_divergence": statistics.median(gaps) if gaps else None,
        "max_top2_gap_at_divergence": max(gaps) if gaps else None,
    }


def speed(model: str, kv_cache_dtype: str, args) -> dict:
    llm = LLM(
        model, kv_cache_dtype=kv_cache_dtype, max_model_len=4096, enable_prefix_caching=False, max_num_seqs=64
    )
    tpot = {rows: decode_tpot(llm, args.context, args.decode_tokens, rows) * 1e3 for rows in (1, 64)}
    llm.close()
    del llm  # before the offline run's engine sizes its cache (see _release)
    _release()
    work = argparse.Namespace(
        served_set=False,
        num_seqs=args.num_seqs,
        input_len=[100, 1024],
        output_len=[100, 1024],
        seed=0,
        engine_kwargs=json.dumps({"kv_cache_dtype": kv_cache_dtype}),
        enforce_eager=False,
        dtype="auto",
        temperature=0.6,
        quiet=True,
    )
    prompts, outputs = make_workload(work)
    offline = run_engine(model, prompts, outputs, work)
    return {"tpot_ms_batch1": tpot[1], "tpot_ms_batch64": tpot[64], "offline_tok_per_s": offline["tok_per_s"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument(
        "--prompts", type=int, default=len(QUESTIONS) + len(MORE_QUESTIONS), help="the first N questions"
    )
    p.add_argument("--context", type=int, default=1000)
    p.add_argument("--decode-tokens", type=int, default=256)
    p.add_argument("--num-seqs", type=int, default=256)
    p.add_argument("--skip-speed", action="store_true")
    p.add_argument("--json-out", default=None)
    args = p.parse_args()
    model = resolve_model(args.model)
    prompts = chat_prompts(model)[: args.prompts]
    runs = {}
    for arm in ARMS:
        runs[arm] = greedy_runs(model, prompts, arm, args.max_tokens)
        _release()
    result = {"agreement": divergence_stats(runs["auto"], runs["fp8"])}
    a = result["agreement"]
    print(
        f"fp8 vs model-dtype ('auto') cache, {a['prompts']} prompts x {args.max_tokens} greedy tokens: "
        f"{a['identical']} identical; median first divergence {a['median_first_divergence']}; "
        f"the 'auto' run's top-2 logit gap there: median "
        f"{a['median_top2_gap_at_divergence']}, max {a['max_top2_gap_at_divergence']}"
    )
    print("first divergences (None: identical):", a["first_divergences"])
    if not args.skip_speed:
        for arm in ARMS:
            result[arm] = speed(model, arm, args)
            _release()
            s = result[arm]
            tpot = f"TPOT batch 1 {s['tpot_ms_batch1']:.3f} ms, batch 64 {s['tpot_ms_batch64']:.3f} ms"
            offline = f"offline {s['offline_tok_per_s']:,.0f} tok/s ({args.num_seqs} seqs)"
            print(f"kv cache {arm}: {tpot} at {args.context} context; {offline}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
