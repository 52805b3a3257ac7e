"""The disaggregation decision with concrete numbers (router/disagg.py)."""

from __future__ import annotations

import pytest

from router.disagg import (
    LOCAL,
    REMOTE,
    DisaggInputs,
    LocalOption,
    RemoteOption,
    decide,
    estimate_local,
    estimate_remote,
    local_roles,
    remote_allowed,
)


def _remote(queued: int = 0, new: int = 1000, **over) -> RemoteOption:
    fields = dict(
        queued_tokens=queued,
        new_tokens=new,
        prompt_tokens=1000,
        prefill_tokens_per_s=10_000.0,
        kv_bytes_per_token=100_000.0,
        transfer_bytes_per_s=1e9,
        decode_admission_s=0.01,
    )
    return RemoteOption(**(fields | over))


def _local(queued: int = 0, new: int = 1000, running: int = 0, **over) -> LocalOption:
    fields = dict(queued_tokens=queued, new_tokens=new, prefill_tokens_per_s=10_000.0, num_running=running)
    return LocalOption(**(fields | over))


def test_remote_estimate_adds_queue_prefill_transfer_and_admission() -> None:
    # (500 + 1000) / 10k = 0.15 s; 1000 tokens x 100 kB at 1 GB/s = 0.1 s; + 0.01 s admission
    assert estimate_remote(_remote(queued=500)) == pytest.approx(0.26)


def test_local_estimate_charges_the_stall_of_every_running_sequence() -> None:
    assert estimate_local(_local(queued=500)) == pytest.approx(0.15)
    # 8 sequences decoding there each wait the prompt's 0.1 s of compute
    assert estimate_local(_local(running=8)) == pytest.approx(0.1 + 8 * 0.1)
    assert estimate_local(_local(running=8, stall_weight=0.5)) == pytest.approx(0.1 + 4 * 0.1)
    assert estimate_local(_local(running=8, stall_weight=0.0)) == pytest.approx(0.1)


def test_auto_prefers_local_on_an_idle_decoder_and_remote_on_a_busy_one() -> None:
    idle = decide(DisaggInputs("auto", _remote(), _local(running=0)))
    assert idle.kind == LOCAL and idle.local_s == pytest.approx(0.1) and idle.remote_s == pytest.approx(0.21)
    busy = decide(DisaggInputs("auto", _remote(), _local(running=4)))
    assert busy.kind == REMOTE and busy.local_s == pytest.approx(0.5)


def test_auto_goes_local_when_the_prefill_queue_is_long() -> None:
    backlog = _remote(queued=40_000)  # 4 s of queued prompts
    assert decide(DisaggInputs("auto", backlog, _local(running=16))).kind == LOCAL


def test_cache_hits_count_on_both_sides() -> None:
    # the local worker holds 960 of the 1000 tokens: 4 ms of compute even with 8 sequences running
    assert decide(DisaggInputs("auto", _remote(), _local(new=40, running=8))).kind == LOCAL
    # the prefill worker holds them all and the transfer is fast: remote
    fast = _remote(new=1, transfer_bytes_per_s=1e12)
    assert decide(DisaggInputs("auto", fast, _local(running=1))).kind == REMOTE


def test_ties_go_remote() -> None:
    d = decide(DisaggInputs("auto", _remote(kv_bytes_per_token=0.0, decode_admission_s=0.0), _local()))
    assert d.remote_s == d.local_s and d.kind == REMOTE


def test_modes_and_missing_options() -> None:
    r, lo = _remote(), _local()
    assert decide(DisaggInputs("always", r, lo)) == (REMOTE, None, None)
    assert decide(DisaggInputs("never", r, lo)) == (LOCAL, None, None)
    assert decide(DisaggInputs("always", None, lo)).kind == LOCAL  # mixed workers alone serve
    assert decide(DisaggInputs("auto", r, None)).kind == REMOTE
    assert decide(DisaggInputs("auto", None, lo)).kind == LOCAL
    assert decide(DisaggInputs("never", r, None)) is None
    assert decide(DisaggInputs("auto", None, None)) is None


def test_roles_per_mode() -> None:
    assert local_roles("always") == ("mixed",)
    assert local_roles("never") == local_roles("auto") == ("decode", "mixed")
    assert remote_allowed("always") and remote_allowed("auto") and not remote_allowed("never")


def test_bad_inputs_name_the_field() -> None:
    with pytest.raises(ValueError, match="disagg"):
        DisaggInputs("sometimes", None, None)
    with pytest.raises(ValueError, match="prefill_tokens_per_s"):
        estimate_local(_local(prefill_tokens_per_s=0.0))
    with pytest.raises(ValueError, match="transfer_bytes_per_s"):
        estimate_remote(_remote(transfer_bytes_per_s=float("inf")))
