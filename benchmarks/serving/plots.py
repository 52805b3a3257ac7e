"""Pictures of the serving benchmarks (PNG, matplotlib's Agg backend: no display needed).

    python benchmarks/serving/plots.py run A.json [B.json ...] --out run.png
    python benchmarks/serving/plots.py cluster LOG_DIR cluster.png

`run`: TTFT and TPOT distributions (CDFs), one curve per `benchmarks/serving/serving.py --json-out` run (each
value of a `--max-concurrency` sweep is a run), and throughput against concurrency for a sweep.
`cluster`: from a `benchmarks/serving/gpu_cluster.sh` log directory (LOG/offline.json,
LOG/<setup>/<workload>.json, read by benchmarks/serving/cluster_table.py), output tok/s per workload and
setup (the offline one-GPU figure as a line over the random workload) and TPOT p50/p99 per workload and
setup.
matplotlib is imported only when a picture is drawn, so serving.py runs without it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.serving.cluster_table import offline_tok_s, rows  # noqa: E402

PANEL_IN = (5.0, 3.8)  # one panel's width and height, inches
DPI = 120
SETUP_ORDER = ("mixed", "nccl", "ipc", "auto")  # gpu_cluster.sh's setups: the aggregated baseline first


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; never a window
    import matplotlib.pyplot as plt

    return plt


def runs_of(label: str, doc: dict) -> list[tuple[str, dict]]:
    """A serving.py document's runs as (label, run): itself, or each value of its concurrency sweep."""
    if "sweep" in doc:
        return [(f"{label} c={r['max_concurrency']}", r) for r in doc["sweep"]]
    return [(label, doc)]


def _cdf(ax, values: list[float], label: str) -> None:
    xs = sorted(values)
    ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=label)


def _distribution_panel(ax, runs: list[tuple[str, dict]], key: str, title: str) -> None:
    for label, run in runs:
        values = run["requests"][key]
        if values:
            _cdf(ax, values, f"{label} (p50 {run['summary'][key]['p50']:.1f} ms)")
    spread = [v for _, run in runs for v in run["requests"][key]]
    log = bool(spread) and min(spread) > 0 and max(spread) > 10 * min(spread)  # log only for wide ranges
    if log:
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(lambda v, _pos: f"{v:g}")
    scale = ", log scale" if log else ""
    ax.set(
        title=title, xlabel=f"{key.removesuffix('_ms').upper()} (ms{scale})", ylabel="fraction of requests"
    )
    ax.set_ylim(0, 1.02)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")


def _sweep_panel(ax, runs: list[tuple[str, dict]]) -> None:
    points = sorted((r["max_concurrency"], r["summary"]["output_tokens_per_s"]) for _, r in runs)
    ax.plot([c for c, _ in points], [t for _, t in points], marker="o")
    ax.set_xscale("log", base=2)
    ax.set_xticks([c for c, _ in points], [str(c) for c, _ in points])
    ax.set_ylim(0, max(t for _, t in points) * 1.1)
    ax.set(title="Throughput against concurrency", xlabel="max concurrency (requests in flight)")
    ax.set_ylabel("output tokens/s")
    ax.grid(True, alpha=0.3)


def is_sweep(runs: list[tuple[str, dict]]) -> bool:
    caps = [r.get("max_concurrency") for _, r in runs]
    return None not in caps and len(set(caps)) > 1


def plot_docs(docs: list[tuple[str, dict]], out_png: str | Path) -> None:
    """Draw serving.py documents, given as (label, document); see the module docstring."""
    runs = [run for label, doc in docs for run in runs_of(label, doc)]
    for label, run in runs:
        if "requests" not in run:
            raise ValueError(f"{label}: no per-request lists (`requests`); written by an older serving.py?")
    panels = 3 if is_sweep(runs) else 2
    plt = _pyplot()
    fig, axes = plt.subplots(1, panels, figsize=(PANEL_IN[0] * panels, PANEL_IN[1]), squeeze=False)
    _distribution_panel(axes[0][0], runs, "ttft_ms", "Time to first token")
    _distribution_panel(axes[0][1], runs, "tpot_ms", "Time per output token")
    if panels == 3:
        _sweep_panel(axes[0][2], runs)
    fig.tight_layout()
    fig.savefig(out_png, dpi=DPI)
    plt.close(fig)


def plot_run(results_json_paths: list[str | Path], out_png: str | Path) -> None:
    """TTFT/TPOT CDFs of serving.py `--json-out` files, one curve per run, labelled by file name."""
    paths = [Path(p) for p in results_json_paths]
    if not paths:
        raise ValueError("results_json_paths: give at least one serving.py --json-out file")
    plot_docs([(p.stem, json.loads(p.read_text())) for p in paths], out_png)


def _grouped_bars(ax, table: list[dict], value, setups: list[str], workloads: list[str], **bar) -> list:
    """One group per workload, one bar per setup; returns the bar containers (for labels)."""
    width = 0.8 / len(setups)
    out = []
    for k, setup in enumerate(setups):
        by_workload = {r["workload"]: r for r in table if r["setup"] == setup}
        xs = [w + (k - (len(setups) - 1) / 2) * width for w in range(len(workloads))]
        heights = [value(by_workload[w]) if w in by_workload else 0.0 for w in workloads]
        out.append(ax.bar(xs, heights, width, label=setup, color=f"C{k}", **bar))
    ax.set_xticks(range(len(workloads)), workloads)
    return out


def _throughput_panel(ax, table: list[dict], offline: float | None, setups, workloads) -> None:
    bars = _grouped_bars(ax, table, lambda r: r["tok_s"], setups, workloads)
    for container in bars:
        ax.bar_label(container, labels=[f"{b.get_height() / 1e3:.0f}k" for b in container], fontsize=7)
    if offline and "random" in workloads:
        x = workloads.index("random")
        ax.hlines(offline, x - 0.45, x + 0.45, colors="black", linestyles="--", label="offline engine, 1 GPU")
        ax.annotate(
            f"offline, 1 GPU: {offline / 1e3:.1f}k", (x, offline), ha="center", va="bottom", fontsize=8
        )
    ax.set(title="Output throughput (higher is better)", ylabel="output tokens/s", xlabel="workload")
    ax.set_ylim(0, max([r["tok_s"] for r in table] + [offline or 0.0]) * 1.12)
    ax.yaxis.set_major_formatter(lambda v, _pos: f"{v / 1e3:.0f}k")
    ax.grid(True, axis="y", alpha=0.3)


def _tpot_panel(ax, table: list[dict], setups, workloads) -> None:
    _grouped_bars(ax, table, lambda r: r["tpot"][1], setups, workloads, alpha=0.35)
    bars = _grouped_bars(ax, table, lambda r: r["tpot"][0], setups, workloads)
    for container in bars:
        ax.bar_label(container, fmt="%.1f", fontsize=7)
    title = (
        "Time per output token: p50 (solid, labelled), p99 (pale)\n(interference: the chat requests' TPOT)"
    )
    ax.set(title=title, ylabel="TPOT (ms, lower is better)", xlabel="workload")
    ax.grid(True, axis="y", alpha=0.3)


def _setup_order(table: list[dict]) -> list[str]:
    """Setups as the docs name them (aggregated first), then any other in name order."""
    known = [s for s in SETUP_ORDER if any(r["setup"] == s for r in table)]
    return known + sorted({r["setup"] for r in table} - set(known))


def plot_cluster(log_dir: str | Path, out_png: str | Path) -> None:
    """Throughput and TPOT bars of a gpu_cluster.sh log directory (module docstring)."""
    log = Path(log_dir)
    table = rows(log)
    if not table:
        raise ValueError(f"log_dir: no <setup>/<workload>.json under {log}")
    setups = _setup_order(table)
    workloads = sorted({r["workload"] for r in table})
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(PANEL_IN[0] * 2.4, PANEL_IN[1] * 1.3))
    _throughput_panel(left, table, offline_tok_s(log), setups, workloads)
    _tpot_panel(right, table, setups, workloads)
    handles, labels = left.get_legend_handles_labels()  # one legend: the colours mean the same in both
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), title="setup", fontsize="small")
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(out_png, dpi=DPI)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    run = sub.add_parser("run", help="TTFT/TPOT distributions of serving.py --json-out files")
    run.add_argument("results", nargs="+", type=Path)
    run.add_argument("--out", required=True, type=Path, help="PNG to write")
    cluster = sub.add_parser("cluster", help="throughput and TPOT of a gpu_cluster.sh log directory")
    cluster.add_argument("log", type=Path)
    cluster.add_argument("out", type=Path, help="PNG to write")
    a = p.parse_args(argv)
    try:
        if a.what == "run":
            plot_run(a.results, a.out)
        else:
            plot_cluster(a.log, a.out)
    except (ValueError, OSError, KeyError) as e:
        p.error(str(e))


if __name__ == "__main__":
    main()
