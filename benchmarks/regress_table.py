"""The table of benchmarks/regress.sh: each figure per arm and round, and each arm against the base.

    python benchmarks/regress_table.py LOG_DIR [--ref ARM]   (FIGURE_ARM_rROUND.json written by regress.sh)

`vs ref` is the speed ratio of the arm's best round to the reference arm's best round (`base` unless
--ref names another; > 1: faster, for a latency too), marked `~` when it is inside the spread of the
two arms' own rounds (the larger of their best/worst ratios): such a difference is noise.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Figure:
    """One figure: which JSON file holds it, how to read it, and whether larger is better."""

    name: str
    file: str
    read: Callable[[Any], float]
    unit: str
    higher_is_better: bool


FIGURES = (
    Figure("offline std (Qwen3-0.6B shape)", "std", lambda j: j[0]["tok_per_s"], "tok/s", True),
    Figure("mixed (real model)", "mixed", lambda j: j[0]["tok_per_s"], "tok/s", True),
    Figure("TPOT b1 @1k", "lat", lambda j: j["tpot_ms_by_batch"]["1"], "ms", False),
    Figure("TPOT b64 @1k", "lat", lambda j: j["tpot_ms_by_batch"]["64"], "ms", False),
    Figure("prefill 8x2048", "lat", lambda j: j["prefill_tok_per_s"], "tok/s", True),
    Figure("serving mixed-1", "serve", lambda j: j["summary"]["output_tokens_per_s"], "tok/s", True),
)
_NAME = re.compile(r"(?P<file>[a-z]+)_(?P<arm>.+)_r(?P<round>\d+)\.json$")


def collect(log: Path) -> dict[tuple[str, str], list[dict]]:
    """(file, arm) -> the parsed JSON of each round, in round order."""
    runs: dict[tuple[str, str], list[tuple[int, dict]]] = {}
    for path in sorted(log.glob("*.json")):
        match = _NAME.match(path.name)
        if match:
            key = (match["file"], match["arm"])
            runs.setdefault(key, []).append((int(match["round"]), json.loads(path.read_text())))
    return {key: [j for _, j in sorted(values, key=lambda v: v[0])] for key, values in runs.items()}


def _speed(value: float, fig: Figure) -> float:
    return value if fig.higher_is_better else 1.0 / value


def rows(runs: dict[tuple[str, str], list[dict]], ref: str) -> list[list[str]]:
    """One row per figure and arm that has it. A figure some arm has but the reference arm lacks (its
    run failed: e.g. a base tree the benchmark script cannot import) gets a row saying so, and the
    others' comparison says there is nothing to compare with: never a silent gap."""
    arms = sorted({arm for _, arm in runs}, key=lambda a: (a != ref, a != "new", a))
    table = []
    for fig in FIGURES:
        base = [_speed(fig.read(j), fig) for j in runs.get((fig.file, ref), [])]
        ran = any(runs.get((fig.file, arm)) for arm in arms)
        for arm in arms:
            values = [fig.read(j) for j in runs.get((fig.file, arm), [])]
            if not values:
                if arm == ref and ran:
                    table.append([fig.name, arm, "no result (not run, or failed: see the log)", "-"])
                continue
            shown = " / ".join(f"{v:,.0f}" if v >= 100 else f"{v:.3f}" for v in values)
            versus = "-" if arm == ref else _versus(base, values, fig)
            table.append([fig.name, arm, f"{shown} {fig.unit}", versus])
    return table


def _versus(base: list[float], values: list[float], fig: Figure) -> str:
    if not base:
        return "no reference"
    speeds = [_speed(v, fig) for v in values]
    ratio = max(speeds) / max(base)
    spread = max(max(s) / min(s) for s in (base, speeds))
    return f"{ratio:.3f}x" + (" ~" if abs(ratio - 1) <= spread - 1 else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--ref", default="base", help="the arm the others are compared with")
    args = parser.parse_args()
    table = rows(collect(args.log), args.ref)
    header = ["figure", "arm", "rounds", f"vs {args.ref} (best rounds)"]
    widths = [max(len(r[i]) for r in [header, *table]) for i in range(len(header))]
    for r in [header, ["-" * w for w in widths], *table]:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |")


if __name__ == "__main__":
    main()
