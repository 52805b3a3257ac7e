"""What the router learns from a request's messages, and what it records when the request ends.

`learn_from` feeds the disaggregation cost model's live figures (router/live_rates.py) from each
worker message as it arrives; `record_token_gap` times each gap between a sequence's token updates
(`pdserve_inter_token_latency_seconds`); `record_finished` puts a finished sequence into /metrics,
including the per-stage breakdown `pdserve_stage_seconds{stage}`: the stages the workers report in
`TokenOutput.timings` plus the router's own "router_queue" (arrival to dispatch) and "decode" (first
decode token to the last token).
"""

from __future__ import annotations

from common.wire.messages import TokenOutput
from router.live_rates import LiveRates
from router.route_planner import Route
from router.router_metrics import RouterMetrics
from router.token_stream import SequenceOutput


def learn_from(rates: LiveRates, route: Route, sent_at: float, msg: TokenOutput, now: float) -> None:
    timings = msg.timings or {}
    if msg.index == 0 and msg.token_ids:
        prefill_s = timings.get("prefill")
        if prefill_s:
            rates.observe_prefill(route.prefill_id, route.new_tokens, prefill_s)
        else:  # everything queued ahead of it, then its own tokens, were computed since dispatch
            rates.observe_first_token(route.prefill_id, route.queued_tokens + route.new_tokens, now - sent_at)
    if msg.kv_transfer_bytes and not route.local:
        rates.observe_transfer(
            route.prefill_id,
            route.decode_id,
            msg.kv_transfer_bytes,
            msg.kv_transfer_seconds,
            route.prompt_tokens,
        )
    if "decode_admission" in timings:
        rates.observe_admission(route.decode_id, timings["decode_admission"])


def record_token_gap(metrics: RouterMetrics, output: SequenceOutput, now: float) -> None:
    """The inter-token latency histogram: the gap since the sequence's previous update with tokens
    (a retry's wait included: the client waited too)."""
    if output.last_token_at is not None:
        metrics.itl.observe(now - output.last_token_at)
    output.last_token_at = now


def record_finished(
    metrics: RouterMetrics, num_prompt_tokens: int, output: SequenceOutput, arrival: float, now: float
) -> None:
    m = metrics
    m.prompt_tokens.inc(output.num_prompt_tokens or num_prompt_tokens)
    m.generation_tokens.inc(output.num_generated)
    m.prefix_hit_tokens.inc(output.cached_tokens)
    m.e2e.observe(now - arrival)
    if output.first_token_at is not None and output.num_generated > 1:
        m.tpot.observe((now - output.first_token_at) / (output.num_generated - 1))
    if output.kv_transfer_bytes:
        m.kv_transfer_bytes.inc(output.kv_transfer_bytes)
        m.kv_transfer_seconds.observe(output.kv_transfer_seconds)
    for stage, seconds in output.timings.items():
        m.stage_seconds.observe(seconds, stage=stage)
    if output.dispatched_at is not None:
        m.stage_seconds.observe(output.dispatched_at - arrival, stage="router_queue")
    if output.first_decode_at is not None:
        m.stage_seconds.observe(now - output.first_decode_at, stage="decode")
