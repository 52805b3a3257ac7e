"""deploy/grafana/pdserve.json queries only what the router's /metrics really exposes.

A router with fake prefill and decode workers serves a few requests (so every labelled series has
samples); then every metric name in the dashboard's PromQL must be a series of the scrape, and every
label a query groups or filters by must be on that metric's samples (or be one Prometheus adds).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import defaultdict
from pathlib import Path

from tests.unit.router.fake_workers import Script
from tests.unit.router.harness import running_router

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana" / "pdserve.json"
TARGET_LABELS = {"job", "instance"}  # added by Prometheus at scrape time, not by the router
WORKER_TIMINGS = {"prefill_queue": 0.001, "prefill": 0.01, "transfer": 0.002, "decode_admission": 0.001}
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? \S+$")
METRIC = re.compile(r"\b(pdserve_[a-z0-9_]+)\b")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
MATCHER = re.compile(r"\{([^}]*)\}")
MATCHER_LABEL = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")


def _queries(dashboard: dict) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [
        v["query"]["query"] for v in dashboard["templating"]["list"] if isinstance(v.get("query"), dict)
    ]
    return exprs


def _scrape_after_traffic(model_dir: Path, tokenizer) -> str:
    reply = tokenizer.encode(" Paris is the capital.", add_special_tokens=False) + [2]
    specs = [
        ("prefill-0", "prefill", Script(reply=reply, timings=WORKER_TIMINGS)),
        ("decode-0", "decode", Script(reply=reply, timings=WORKER_TIMINGS)),
    ]

    async def main() -> str:
        async with running_router(model_dir, tokenizer, specs) as h:
            for prompt in ("What is the capital of France?", "What is the capital of France? Paris?"):
                r = await h.client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 8})
                assert r.status_code == 200, r.text
            r = await h.client.get("/metrics")
            assert r.status_code == 200
            return r.text

    return asyncio.run(main())


def _exposed_labels(scrape: str) -> dict[str, set[str]]:
    """Series name -> label names seen on its samples. Every declared family counts, with or without
    samples yet (a counter nothing has incremented has none), histograms as name_bucket/_sum/_count."""
    labels: dict[str, set[str]] = defaultdict(set)
    for line in scrape.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            for suffix in ("_bucket", "_sum", "_count") if kind == "histogram" else ("",):
                labels[name + suffix] |= set()
        match = SAMPLE.match(line)
        if match and not line.startswith("#"):
            name, label_text = match.groups()
            labels[name] |= set(MATCHER_LABEL.findall(label_text or ""))
    return labels


def _labels_used(expr: str) -> set[str]:
    used = {label.strip() for group in GROUPING.findall(expr) for label in group.split(",") if label.strip()}
    for matcher in MATCHER.findall(expr):
        used |= set(MATCHER_LABEL.findall(matcher))
    return used


def test_every_dashboard_query_uses_exposed_metrics_and_labels(model_dir, tokenizer) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exposed = _exposed_labels(_scrape_after_traffic(model_dir, tokenizer))
    queried: set[str] = set()
    for expr in _queries(dashboard):
        metrics = set(METRIC.findall(expr))
        assert metrics, f"query without a pdserve metric: {expr}"
        missing = metrics - set(exposed)
        assert not missing, f"{expr}\nqueries {missing}, which /metrics does not expose"
        available = set().union(*(exposed[m] for m in metrics)) | TARGET_LABELS
        assert _labels_used(expr) <= available, f"{expr}\nuses labels {_labels_used(expr) - available}"
        queried |= metrics
    # What the dashboard is for: each of these must be on it.
    for family in (
        "pdserve_requests_total",
        "pdserve_time_to_first_token_seconds_bucket",
        "pdserve_time_per_output_token_seconds_bucket",
        "pdserve_generation_tokens_total",
        "pdserve_prefix_cache_hit_tokens_total",
        "pdserve_kv_cache_usage_ratio",
        "pdserve_kv_transfer_bytes_total",
        "pdserve_disagg_decisions_total",
        "pdserve_stage_seconds_sum",
        "pdserve_worker_up",
    ):
        assert family in queried, family


def test_the_dashboard_is_importable_as_written() -> None:
    """Grafana needs unique panel ids, a grid position and a Prometheus datasource on every query."""
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    for panel in dashboard["panels"]:
        assert (
            set(panel["gridPos"]) == {"h", "w", "x", "y"}
            and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        )
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}" and target["refId"]
