"""Verified hand-offs end to end: a real prefill role hands a prompt to a real decode role over the tcp
transport (real ZMQ sockets), each corruption is injected on the way, the decode worker's checks catch
it before the first decode step, and it recomputes: the greedy answer is still the offline engine's."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from common.wire.messages import DecodeRequest
from tests.helpers.kv_proxy import KVProxy, flip_a_byte, redirect_fetch, swap_served_hashes
from tests.unit.decode_worker.cases import MAX_TOKENS, PROMPTS
from tests.unit.prefill_worker.harness import Pair, prefill_request, run_until

LONG = 3  # PROMPTS[3]: 70 tokens, 5 blocks of 16, the last one partly filled


@pytest.fixture
def pair(tiny_model_dirs):
    p = Pair.of(tiny_model_dirs["llama"], kv_fetch_timeout_s=20.0)
    yield p
    p.close()


def _handoffs(pair: Pair, prompts: dict[str, list[int]]) -> dict[str, DecodeRequest]:
    """Prefill each request; take the DecodeRequests the prefill worker sends instead of delivering them."""
    for rid, prompt in prompts.items():
        pair.prefill.handle(prefill_request(rid, prompt, max_tokens=MAX_TOKENS, ignore_eos=True))
    peers = pair.prefill.channels.peers
    run_until([pair.prefill], lambda: len(peers) == len(prompts))
    out = {msg.request_id: msg for _, msg in peers}
    peers.clear()
    return out


def _decode(pair: Pair, req: DecodeRequest, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="decode_worker.role"):
        pair.decode.handle(req)
        run_until([pair.prefill, pair.decode], lambda: pair.finished(req.request_id), timeout=60)
    failures = [r.getMessage() for r in caplog.records if "KV transfer failed" in r.getMessage()]
    assert len(failures) == 1 and "verification failed" in failures[0], failures
    caplog.clear()


@pytest.mark.parametrize("corruption", ["wrong blocks", "stale epoch", "flipped bytes"])
def test_a_corrupt_handoff_is_recomputed(pair, reference, caplog, corruption) -> None:
    req = _handoffs(pair, {"r": PROMPTS[LONG]})["r"]
    handoff, proxy = req.handoff, None
    if corruption == "stale epoch":
        handoff = replace(handoff, epoch=handoff.epoch + 1)
    else:  # on the wire: blocks reported out of the prompt's order, or a flipped bit in the data
        rewrite = swap_served_hashes if corruption == "wrong blocks" else flip_a_byte
        proxy = KVProxy(handoff.address, to_receiver=rewrite)
        handoff = replace(handoff, address=proxy.address)
    req = replace(req, handoff=handoff)
    try:
        _decode(pair, req, caplog)
    finally:
        if proxy is not None:
            proxy.close()
    assert pair.tokens("r") == reference[LONG]
    run_until([pair.prefill], lambda: not pair.prefill.engine.scheduler.handed_off)  # released, not leaked


def test_a_transfer_meant_for_another_request_is_recomputed(pair, reference, caplog) -> None:
    """The fetch is served from another request's publication (a prompt as long, other tokens)."""
    theirs = [(t + 1) % 500 for t in PROMPTS[LONG]]
    reqs = _handoffs(pair, {"mine": PROMPTS[LONG], "theirs": theirs})
    mine = reqs["mine"]
    out, back = redirect_fetch(to=reqs["theirs"].handoff, from_request="mine")
    proxy = KVProxy(mine.handoff.address, to_sender=out, to_receiver=back)
    try:
        _decode(pair, replace(mine, handoff=replace(mine.handoff, address=proxy.address)), caplog)
    finally:
        proxy.close()
    assert pair.tokens("mine") == reference[LONG]
