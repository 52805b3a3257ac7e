"""Verified hand-offs end to end: a real prefill role hands a prompt to a real decode role over the tcp
transport (real ZMQ sockets), each corruption is injected on the way, the decode worker's checks catch
it before the first decode step, and it recomputes: the greedy answer is still the offline engine's."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from common.wire.messages import DecodeRequest
from tests.helpers.kv_proxy import KVProxy, flip_a_byte, redirect_fetch
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
    proxy = None
    if corruption == "wrong blocks":
        src = req.src_block_ids
        req = replace(req, src_block_ids=[src[1], src[0], *src[2:]])
    elif corruption == "stale epoch":
        req = replace(req, kv_endpoint={**req.kv_endpoint, "epoch": req.kv_endpoint["epoch"] + 1})
    else:
        proxy = KVProxy(req.kv_endpoint["address"], to_receiver=flip_a_byte)
        req = replace(req, kv_endpoint={**req.kv_endpoint, "address": proxy.address})
    try:
        _decode(pair, req, caplog)
    finally:
        if proxy is not None:
            proxy.close()
    assert pair.tokens("r") == reference[LONG]
    run_until([pair.prefill], lambda: not pair.prefill.engine.scheduler.handed_off)  # released, not leaked


def test_a_transfer_meant_for_another_request_is_recomputed(pair, reference, caplog) -> None:
    """The fetch is served from another request's publication (a prompt as long, other tokens, so the
    block ids asked for are among its blocks once the sender's ids are remapped below)."""
    theirs = [(t + 1) % 500 for t in PROMPTS[LONG]]
    reqs = _handoffs(pair, {"mine": PROMPTS[LONG], "theirs": theirs})
    mine = replace(reqs["mine"], src_block_ids=reqs["theirs"].src_block_ids)  # ids the sender serves
    mine_src = reqs["mine"].src_block_ids
    out, back = redirect_fetch(to_request="theirs", from_request="mine")
    proxy = KVProxy(mine.kv_endpoint["address"], to_sender=out, to_receiver=back)
    try:
        _decode(pair, replace(mine, kv_endpoint={**mine.kv_endpoint, "address": proxy.address}), caplog)
    finally:
        proxy.close()
    assert pair.tokens("mine") == reference[LONG]
    assert mine_src != mine.src_block_ids
