"""benchmarks/chaos*.py pieces that decide the soak's verdict: how an outcome is classified, when a
greedy answer is wrong, the fault deck, RSS baselines and the KV fault count from worker logs. The
whole soak against a real cluster is tests/integration/test_chaos.py."""

from __future__ import annotations

import os
import random
from collections import Counter

from benchmarks.chaos.chaos_faults import FAULT_KINDS, Chaos, FaultConfig
from benchmarks.chaos.chaos_load import CHOICES, Mix, Outcome, RequestSpec, settle
from benchmarks.chaos.chaos_report import Reference, RssTrack, goals, kv_fault_counts, summarize, wrong_answer

REFS = {(0, 8): Reference("Paris is the capital", 5, "length")}


def outcome(kind: str, started: float = 10.0, ended: float = 11.0, **spec) -> Outcome:
    fields = dict(prompt=0, max_tokens=8, greedy=True, stream=True) | spec
    return Outcome(RequestSpec(**fields), started, ended, kind)


def test_transport_failures_count_as_lost_unless_the_router_was_restarting() -> None:
    windows = [(20.0, 25.0)]
    during, before, after = (
        outcome("transport", 19, 21),
        outcome("transport", 10, 11),
        outcome("transport", 26, 27),
    )
    for out in (during, before, after):
        settle(out, windows)
    assert (during.kind, before.kind, after.kind) == ("router_down", "lost", "lost")
    clear = outcome("error", 21, 22)
    settle(clear, windows)
    assert clear.kind == "error"  # only transport failures are reclassified


def test_greedy_answers_must_be_the_offline_ones() -> None:
    good = outcome("ok")
    good.text, good.completion_tokens, good.finish_reason = "Paris is the capital", 5, "length"
    assert wrong_answer(good, REFS) is None
    for field, value in (("text", "Paris is a city"), ("completion_tokens", 4), ("finish_reason", "stop")):
        bad = outcome("ok")
        bad.text, bad.completion_tokens, bad.finish_reason = good.text, 5, "length"
        setattr(bad, field, value)
        assert wrong_answer(bad, REFS), field
    partial = outcome("disconnected")
    partial.text = "Paris is"
    assert wrong_answer(partial, REFS) is None  # a prefix of the offline answer
    partial.text = "Paris was"
    assert wrong_answer(partial, REFS)
    sampled = outcome("ok", greedy=False)
    sampled.text = "anything"
    assert wrong_answer(sampled, REFS) is None


def test_constrained_answers_must_be_one_of_the_choices() -> None:
    good = outcome("ok", choice=True, greedy=False)
    good.text, good.finish_reason = CHOICES[2], "stop"
    assert wrong_answer(good, REFS) is None
    for text, reason in (("yes!", "stop"), ("maybe", "stop"), (CHOICES[0], "length")):
        bad = outcome("ok", choice=True)
        bad.text, bad.finish_reason = text, reason
        assert wrong_answer(bad, REFS), (text, reason)
    partial = outcome("disconnected", choice=True)
    partial.text = "may"
    assert wrong_answer(partial, REFS) is None  # the start of a choice
    partial.text = "nope"
    assert wrong_answer(partial, REFS)
    body = RequestSpec(0, 8, True, False, choice=True).body([[1, 2]])
    assert body["guided_choice"] == CHOICES
    assert "guided_choice" not in RequestSpec(0, 8, True, False).body([[1, 2]])
    drawn = [Mix(4, choice_share=0.5).draw(random.Random(i)).choice for i in range(200)]
    assert 60 < sum(drawn) < 140


def test_summary_and_goals() -> None:
    lost = outcome("lost")
    lost.detail = "no answer within 90s"
    good = outcome("ok")
    good.text, good.completion_tokens, good.finish_reason = "Paris is the capital", 5, "length"
    rss = [{"process": "router", "pid": 1, "start_mb": 90.0, "end_mb": 95.0, "growth_pct": 5.6}]
    failed = outcome("error", greedy=False, seed=None)
    failed.detail = "503 worker_failed"
    faults = Counter(kill_decode=2, failed_router_restart=1)
    summary = summarize([lost, good, failed], REFS, faults, {"decode-0": 3, "prefill-1": -1}, rss)
    assert (summary["requests"], summary["lost"], summary["wrong"], summary["greedy_checked"]) == (3, 1, 0, 1)
    assert summary["errors"] == {"503 worker_failed (unseeded)": 1}
    assert (summary["leaked_blocks"], summary["not_live_at_end"]) == (3, ["prefill-1"])
    met = goals(summary, rss_limit_pct=5.0)
    assert [name for name, ok in met.items() if not ok] == [
        "lost == 0",
        "leaked blocks == 0",
        "every worker live at the end",
        "every fault injected",
        "rss growth <= 5%",
    ]


def test_every_fault_kind_comes_once_per_deck_in_a_seeded_order() -> None:
    def deck(seed: int) -> list[str]:
        chaos = Chaos(cluster=None, config=FaultConfig(every_s=1.0), rng=random.Random(seed))  # type: ignore[arg-type]
        try:
            return [chaos._next_kind() for _ in range(2 * len(FAULT_KINDS))]
        finally:
            chaos.close()

    first = deck(1)
    assert sorted(first[: len(FAULT_KINDS)]) == sorted(FAULT_KINDS) == sorted(first[len(FAULT_KINDS) :])
    assert first == deck(1) and first != deck(2)


def test_disconnecting_streams_ask_for_the_longest_answer() -> None:
    mix = Mix(pool_size=4, max_tokens=(4, 8))
    spec = mix.draw(random.Random(0), disconnect=True)
    assert spec.stream and spec.max_tokens == 16 and 1 <= spec.disconnect_after <= 3
    assert spec.body([[1], [2], [3], [4]])["stream_options"] == {"include_usage": True}


def test_rss_baseline_waits_for_the_warm_up() -> None:
    track = RssTrack(warmup_s=0.0)
    track.sample({"me": os.getpid()})
    track.sample({"me": os.getpid(), "gone": 2**22 + 7})  # no such process: skipped
    (row,) = track.rows()
    assert row["process"] == "me" and row["start_mb"] > 1
    assert RssTrack(warmup_s=3600.0).rows() == []


def test_kv_faults_are_counted_from_the_worker_logs(tmp_path) -> None:
    (tmp_path / "decode-0.log").write_text(
        "x WARNING decode-0 kvtransfer.faults: injected KV fault: drop cmpl-1-0\n"
        "x WARNING decode-0 kvtransfer.faults: injected KV fault: delay cmpl-2-0\n"
    )
    (tmp_path / "decode-1.log").write_text(
        "x WARNING decode-1 kvtransfer.faults: injected KV fault: drop r\n"
    )
    assert kv_fault_counts(tmp_path) == Counter(kv_drop=2, kv_delay=1)
