"""The router's detokenizing cost per streamed token: window decoding against the byte table.

`--streams` detokenizers (one per in-flight request, as the router holds them) each take one token per
round, round-robin, the way one decode step's tokens reach the router; the tokens are the default
model's (or `--model`'s) encoding of this repository's README, so they hold multi-token characters
and spaces as real text does. Arms alternate `--rounds` times; per arm the us per token of each round.

    python benchmarks/serving/detokenize.py --streams 128 --tokens 128 --rounds 3 [--stop STRING]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from common.tools.default_model import prepare_default_model
from common.wire.detokenizer import IncrementalDetokenizer
from router.tokenizer import ModelTokenizer

ROOT = Path(__file__).resolve().parents[2]


def us_per_token(tok: ModelTokenizer, streams: list[list[int]], stop: list[str], by_bytes: bool) -> float:
    table = tok.byte_table if by_bytes else None
    detoks = [IncrementalDetokenizer(tok.backend, s[:5], stop, byte_table=table) for s in streams]
    began = time.perf_counter()
    for step in range(5, len(streams[0])):
        for detok, ids in zip(detoks, streams, strict=True):
            detok.add([ids[step]])
    return (time.perf_counter() - began) / (len(streams) * (len(streams[0]) - 5)) * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model directory for the tokenizer (default model)")
    p.add_argument("--streams", type=int, default=128)
    p.add_argument("--tokens", type=int, default=128, help="tokens per stream")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--stop", action="append", default=[], help="a stop string every stream checks")
    a = p.parse_args()
    tok = ModelTokenizer.from_dir(a.model or prepare_default_model(progress=False))
    if tok.byte_table is None:
        p.error("this tokenizer has no byte table (not byte-level BPE): nothing to compare")
    text = tok.encode((ROOT / "README.md").read_text())
    span = a.tokens + 5
    if len(text) < span:
        p.error(f"--tokens: the README encodes to {len(text)} tokens")
    streams = [text[(i * 37) % (len(text) - span) :][:span] for i in range(a.streams)]
    results: dict[str, list[float]] = {"window": [], "bytes": []}
    for _ in range(a.rounds):
        for arm in results:
            results[arm].append(us_per_token(tok, streams, a.stop, arm == "bytes"))
    for arm, runs in results.items():
        shown = " / ".join(f"{r:.2f}" for r in runs)
        print(f"{arm:7s} us per token: {shown} (median {statistics.median(runs):.2f})")


if __name__ == "__main__":
    main()
