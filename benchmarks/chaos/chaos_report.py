"""The chaos soak's checks and report: greedy answers against the offline engine, memory over time,
leaked blocks, the counts and the goals. See benchmarks/chaos/chaos.py for the whole soak."""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.chaos.chaos_load import CHOICES, Outcome

KV_FAULT_LINE = re.compile(r"injected KV fault: (drop|delay) ")


@dataclass(frozen=True)
class Reference:
    text: str
    num_tokens: int
    finish_reason: str


def offline_references(model: str, engine: dict, pool: list[list[int]], lengths, tokenizer) -> dict:
    """(prompt index, max_tokens) -> the offline engine's greedy Reference, for every pair the load
    may send. The engine is freed before returning (on a GPU the cluster needs the memory)."""
    import gc

    import torch

    from common import LLM
    from common.wire.sampling_params import SamplingParams

    llm = LLM(model, **engine)
    pairs = [(i, n) for n in sorted(set(lengths)) for i in range(len(pool))]
    params = [SamplingParams(temperature=0, max_tokens=n) for _, n in pairs]
    outs = llm.generate([pool[i] for i, _ in pairs], params, use_tqdm=False)  # one batch
    if not torch.cuda.is_available():
        # Every core while no cluster runs (this comes first); then one thread, so this process never
        # spins a thread pool against the cluster's processes on the same cores.
        torch.set_num_threads(1)
    refs = {}
    for pair, out in zip(pairs, outs, strict=True):
        ids = out["token_ids"]
        refs[pair] = Reference(tokenizer.decode(ids), len(ids), out["finish_reason"])
    del llm
    gc.collect()
    _free_device_cache()
    return refs


def _free_device_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def wrong_answer(out: Outcome, refs: dict) -> str | None:
    """Why a greedy outcome disagrees with the offline engine, or a constrained one with its choices,
    or None. Complete answers must equal it (be one of them); what a stream showed before an error or
    a disconnect must be a prefix of it (of one of them)."""
    spec = out.spec
    if spec.choice:
        return _wrong_choice(out)
    if not spec.greedy:
        return None
    want = refs[(spec.prompt, spec.max_tokens)]
    if out.kind == "ok":
        got = (out.text, out.completion_tokens, out.finish_reason)
        if got != (want.text, want.num_tokens, want.finish_reason):
            return f"prompt {spec.prompt} max {spec.max_tokens}: got {got!r}, offline {want!r}"
    elif out.kind in ("error", "disconnected") and spec.stream and not want.text.startswith(out.text):
        return f"prompt {spec.prompt}: partial stream {out.text!r} is not a prefix of offline {want.text!r}"
    return None


def _wrong_choice(out: Outcome) -> str | None:
    if out.kind == "ok" and (out.text not in CHOICES or out.finish_reason != "stop"):
        return f"prompt {out.spec.prompt}: {out.text!r} ({out.finish_reason}) is none of {CHOICES}"
    partial = out.kind in ("error", "disconnected") and out.spec.stream
    if partial and not any(c.startswith(out.text) for c in CHOICES):
        return f"prompt {out.spec.prompt}: partial stream {out.text!r} begins none of {CHOICES}"
    return None


@dataclass
class RssTrack:
    """RSS samples per process life (name, pid): the first after `warmup_s` of its life and the last."""

    warmup_s: float
    born: dict[tuple[str, int], float] = field(default_factory=dict)
    first: dict[tuple[str, int], int] = field(default_factory=dict)
    last: dict[tuple[str, int], int] = field(default_factory=dict)

    def sample(self, pids: dict[str, int]) -> None:
        now = time.monotonic()
        for name, pid in pids.items():
            key = (name, pid)
            self.born.setdefault(key, now)
            rss = rss_bytes(pid)
            if rss is None or now - self.born[key] < self.warmup_s:
                continue
            self.first.setdefault(key, rss)
            self.last[key] = rss

    def rows(self) -> list[dict]:
        """Per process life with a baseline: MB at the baseline and at the end, growth in percent."""
        rows = []
        for key, start in self.first.items():
            end = self.last[key]
            rows.append(
                {
                    "process": key[0],
                    "pid": key[1],
                    "start_mb": round(start / 2**20, 1),
                    "end_mb": round(end / 2**20, 1),
                    "growth_pct": round(100.0 * (end - start) / start, 1),
                }
            )
        return rows


def rss_bytes(pid: int) -> int | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else None


def kv_fault_counts(log_dir: Path) -> Counter[str]:
    """Injected KV faults by kind, from the workers' logs (kvtransfer/faults.py logs each one)."""
    counts: Counter[str] = Counter()
    for path in log_dir.glob("*.log"):
        for match in KV_FAULT_LINE.finditer(path.read_text(errors="replace")):
            counts[f"kv_{match.group(1)}"] += 1
    return counts


def request_class(out: Outcome) -> str:
    """greedy / seeded / unseeded: only the last cannot be replayed after its decode worker died."""
    spec = out.spec
    return "greedy" if spec.greedy else ("seeded" if spec.seed is not None else "unseeded")


def summarize(outcomes: list[Outcome], refs: dict, faults: Counter, leaked: dict, rss: list[dict]) -> dict:
    kinds = Counter(o.kind for o in outcomes)
    wrong = [w for o in outcomes if (w := wrong_answer(o, refs))]
    lost = [f"{o.spec}: {o.detail}" for o in outcomes if o.kind == "lost"]
    return {
        "requests": len(outcomes),
        "outcomes": dict(kinds),
        "errors": dict(Counter(f"{o.detail} ({request_class(o)})" for o in outcomes if o.kind == "error")),
        "greedy_checked": sum(1 for o in outcomes if o.spec.greedy and not o.spec.choice and o.kind == "ok"),
        "choice_checked": sum(1 for o in outcomes if o.spec.choice and o.kind == "ok"),
        "faults": dict(sorted(faults.items())),
        "lost": len(lost),
        "lost_examples": lost[:10],
        "wrong": len(wrong),
        "wrong_examples": wrong[:10],
        "leaked_blocks": sum(n for n in leaked.values() if n > 0),
        "leaked_by_worker": {w: n for w, n in leaked.items() if n > 0},
        "not_live_at_end": sorted(w for w, n in leaked.items() if n < 0),
        "rss": rss,
    }


def goals(summary: dict, rss_limit_pct: float) -> dict[str, bool]:
    return {
        "lost == 0": summary["lost"] == 0,
        "wrong == 0": summary["wrong"] == 0,
        "leaked blocks == 0": summary["leaked_blocks"] == 0,
        "every worker live at the end": not summary["not_live_at_end"],
        "every fault injected": not any(k.startswith("failed_") for k in summary["faults"]),
        f"rss growth <= {rss_limit_pct:g}%": all(r["growth_pct"] <= rss_limit_pct for r in summary["rss"]),
    }


def format_report(summary: dict, met: dict[str, bool]) -> str:
    lines = [
        f"requests: {summary['requests']}  outcomes: {summary['outcomes']}",
        f"clear errors: {summary['errors']}",
        f"greedy answers checked against the offline engine: {summary['greedy_checked']}, "
        f"constrained answers checked against their choices: {summary['choice_checked']}",
        f"faults: {summary['faults']}",
        f"lost: {summary['lost']}  wrong: {summary['wrong']}  leaked blocks: {summary['leaked_blocks']}",
    ]
    lines += [f"  lost: {x}" for x in summary["lost_examples"]]
    lines += [f"  wrong: {x}" for x in summary["wrong_examples"]]
    if summary["leaked_blocks"] or summary["not_live_at_end"]:
        lines.append(
            f"  leaked by worker: {summary['leaked_by_worker']}; not live: {summary['not_live_at_end']}"
        )
    lines.append("rss (MB, after warm-up -> end):")
    for r in summary["rss"]:
        change = f"{r['start_mb']:>8} -> {r['end_mb']:>8} ({r['growth_pct']:+}%)"
        lines.append(f"  {r['process']:<12} pid {r['pid']:<8} {change}")
    lines += [f"goal {name}: {'met' if ok else 'MISSED'}" for name, ok in met.items()]
    return "\n".join(lines)
