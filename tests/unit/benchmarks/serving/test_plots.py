"""benchmarks/serving/plots.py: real PNGs from serving.py documents and gpu_cluster.sh log directories.

The serving documents are built with serving.py's own summarize/per_request_ms from synthetic
request results, so the plots read exactly what the benchmark writes.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import matplotlib.image
import pytest

from benchmarks.serving import plots
from benchmarks.serving.serving_stats import RequestResult, per_request_ms, summarize

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
REAL_RUN = Path(__file__).resolve().parents[4] / "docs" / "data" / "h200x2-a6e06dd"


def _results(n: int, ttft_s: float, seed: int) -> list[RequestResult]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        ttft = ttft_s * rng.uniform(0.5, 3.0)
        out.append(
            RequestResult(latency_s=ttft + 0.002 * rng.uniform(1, 2) * 15, ttft_s=ttft, output_tokens=16)
        )
    return out


def _run_doc(cap: int | None, seed: int = 0) -> dict:
    results = _results(40, ttft_s=0.05 * (cap or 1), seed=seed)
    return {"max_concurrency": cap, "summary": summarize(results, 2.0), "requests": per_request_ms(results)}


def _image_size(path: Path) -> tuple[int, int]:
    """(width, height) in pixels, as matplotlib reads the file back."""
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    height, width = matplotlib.image.imread(path).shape[:2]
    return width, height


def test_per_request_lists_are_rounded_milliseconds():
    r = [RequestResult(latency_s=0.1, ttft_s=0.0123456, output_tokens=3), RequestResult(error="x")]
    r.append(RequestResult(latency_s=0.1, ttft_s=0.02, output_tokens=1))  # one token: no TPOT
    lists = per_request_ms(r)
    assert lists["ttft_ms"] == [12.35, 20.0]
    assert lists["tpot_ms"] == [round((0.1 - 0.0123456) / 2 * 1e3, 2)]


def test_plot_run_draws_one_curve_per_file(tmp_path):
    paths = []
    for k in range(2):
        paths.append(tmp_path / f"run{k}.json")
        paths[-1].write_text(json.dumps({"args": {}} | _run_doc(None, seed=k)))
    out = tmp_path / "run.png"
    plots.plot_run(paths, out)
    width, height = _image_size(out)
    assert (width, height) == (2 * plots.PANEL_IN[0] * plots.DPI, plots.PANEL_IN[1] * plots.DPI)


def test_a_sweep_adds_the_throughput_panel(tmp_path):
    doc = {"args": {}, "sweep": [_run_doc(c) for c in (1, 4, 16)]}
    assert [label for label, _ in plots.runs_of("s", doc)] == ["s c=1", "s c=4", "s c=16"]
    out = tmp_path / "sweep.png"
    plots.plot_docs([("s", doc)], out)
    assert _image_size(out)[0] == 3 * plots.PANEL_IN[0] * plots.DPI


def test_documents_without_per_request_lists_are_refused(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"args": {}, "summary": _run_doc(None)["summary"]}))
    with pytest.raises(ValueError, match="old: no per-request lists"):
        plots.plot_run([path], tmp_path / "x.png")
    with pytest.raises(ValueError, match="results_json_paths"):
        plots.plot_run([], tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def _write_log(log: Path) -> None:
    (log / "offline.json").parent.mkdir(parents=True, exist_ok=True)
    (log / "offline.json").write_text(json.dumps([{"engine": "pdserve", "tok_per_s": 5000.0}]))
    for k, setup in enumerate(("mixed", "nccl")):
        for workload in ("random", "multiturn"):
            (log / setup).mkdir(exist_ok=True)
            doc = {"args": {}, "by_kind": {}} | _run_doc(8, seed=k)
            (log / setup / f"{workload}.json").write_text(json.dumps(doc))


def test_plot_cluster_from_a_log_directory(tmp_path):
    _write_log(tmp_path / "log")
    (tmp_path / "empty").mkdir()
    out = tmp_path / "cluster.png"
    plots.plot_cluster(tmp_path / "log", out)
    width, height = _image_size(out)
    assert width > height > 100
    with pytest.raises(ValueError, match="log_dir"):
        plots.plot_cluster((tmp_path / "empty").resolve(), tmp_path / "empty.png")


def test_the_committed_cluster_picture_renders_from_its_data(tmp_path):
    out = tmp_path / "h200x2.png"
    plots.main(["cluster", str(REAL_RUN), str(out)])
    assert _image_size(out) == _image_size(REAL_RUN.parents[1] / "img" / "h200x2_cluster.png")
