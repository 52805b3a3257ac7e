"""Learned figures for the disaggregation cost model (router/live_rates.py)."""

from __future__ import annotations

import pytest

from router.live_rates import EWMA_ALPHA, PRIORS, LiveRates


def test_priors_before_any_sample() -> None:
    r = LiveRates()
    assert r.prefill_tokens_per_s("p0") == PRIORS.prefill_tokens_per_s
    assert r.transfer_bytes_per_s("p0", "d0") == PRIORS.transfer_bytes_per_s
    assert r.kv_bytes_per_token == PRIORS.kv_bytes_per_token
    assert r.decode_admission_s("d0") == PRIORS.decode_admission_s


def test_prefill_rate_from_time_to_first_token_and_from_reported_timings() -> None:
    r = LiveRates()
    r.observe_first_token("p0", tokens_computed=3000, seconds=0.5)  # queue + own tokens since dispatch
    assert r.prefill_tokens_per_s("p0") == 6000  # the first sample replaces the prior
    r.observe_prefill("p0", new_tokens=1000, prefill_s=0.1)  # the worker's own measure
    assert r.prefill_tokens_per_s("p0") == pytest.approx(6000 + EWMA_ALPHA * (10_000 - 6000))
    r.observe_first_token("p0", 0, 1.0)  # nothing computed: no sample
    r.observe_prefill("p0", 10, 0.0)
    assert r.prefill_tokens_per_s("p0") == pytest.approx(6800)
    assert r.prefill_tokens_per_s("p1") == PRIORS.prefill_tokens_per_s


def test_transfer_figures_per_pair_with_the_cluster_mean_for_unmeasured_pairs() -> None:
    r = LiveRates()
    r.observe_transfer("p0", "d0", num_bytes=4_000_000, seconds=0.002, prompt_tokens=100)
    r.observe_transfer("p1", "d0", num_bytes=4_000_000, seconds=0.004, prompt_tokens=100)
    assert r.transfer_bytes_per_s("p0", "d0") == 2e9 and r.transfer_bytes_per_s("p1", "d0") == 1e9
    assert r.transfer_bytes_per_s("p0", "d9") == 1.5e9
    assert r.kv_bytes_per_token == 40_000
    r.observe_admission("d0", 0.02)
    assert r.decode_admission_s("d0") == 0.02 and r.decode_admission_s("d1") == PRIORS.decode_admission_s


def test_snapshot_shows_every_figure() -> None:
    r = LiveRates()
    r.observe_first_token("m0", 100, 0.01)
    r.observe_transfer("p0", "d0", 1000, 0.001, 10)
    snap = r.snapshot()
    assert snap["prefill_tokens_per_s"] == {"m0": {"value": 10_000.0, "samples": 1}}
    assert snap["transfer_bytes_per_s"]["p0->d0"]["samples"] == 1
    assert snap["kv_bytes_per_token"]["value"] == 100.0
    assert snap["priors"]["prefill_tokens_per_s"] == PRIORS.prefill_tokens_per_s
