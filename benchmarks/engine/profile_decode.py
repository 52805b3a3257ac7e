"""Where a decode step's time goes: host-side Python (cProfile) vs GPU time of the graph replay.

python benchmarks/engine/profile_decode.py --model DIR [--num-seqs 256]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from common import LLM, SamplingParams  # noqa: E402


def graph_gpu_ms(llm: LLM, sizes: list[int]) -> dict[int, float]:
    """Median GPU time of replaying the captured decode graph of each batch size."""
    graphs = llm.engine.runner.graphs
    out = {}
    for bs in sizes:
        times = []
        for _ in range(20):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graphs.graphs[bs].replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        out[bs] = sorted(times)[len(times) // 2]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True)
    p.add_argument("--num-seqs", type=int, default=256)
    args = p.parse_args()
    llm = LLM(args.model, max_model_len=4096, max_num_seqs=256)
    rng = random.Random(0)
    prompts = [[rng.randrange(10000) for _ in range(rng.randint(100, 1024))] for _ in range(args.num_seqs)]
    params = SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=200)
    llm.generate(prompts[:8], SamplingParams(max_tokens=8), use_tqdm=False)
    prof = cProfile.Profile()
    prof.enable()
    llm.generate(prompts, params, use_tqdm=False)
    prof.disable()
    t = llm.engine.timings
    steps = max(t.decode_steps, 1)
    print(
        f"decode steps {t.decode_steps}: {1e3 * t.decode_forward / steps:.2f} ms forward+sample, "
        f"{1e3 * t.schedule / steps:.2f} ms schedule, {1e3 * t.postprocess / steps:.2f} ms postprocess"
    )
    print("graph replay GPU ms:", graph_gpu_ms(llm, [1, 16, 64, 128, 256]))
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(22)
    print("\n".join(buf.getvalue().splitlines()[:45]))


if __name__ == "__main__":
    main()
