"""Decode workers that speculate (n-gram lookup): the router sees ordinary token streams and the
greedy answers equal the offline engine's."""

from __future__ import annotations

import httpx
import pytest

from common.wire.sampling_params import SamplingParams
from tests.integration.launcher import launch
from tests.integration.test_launcher_shutdown import SMALL

pytestmark = pytest.mark.timeout(240)


def test_speculating_decode_workers_match_offline(model_dir, tmp_path, offline, tokenizer) -> None:
    flags = ["--prefill", "1", "--decode", "1", "--speculative", "ngram", "--num-speculative-tokens", "4"]
    cluster = launch(model_dir, tmp_path, *flags, *SMALL)
    try:
        text = "one two three four five six seven eight. one two three four five six seven eight. one two"
        ids = tokenizer.encode(text)
        want = offline.generate([ids], SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)[0]
        body = {"prompt": ids, "max_tokens": 24, "temperature": 0}
        plain = httpx.post(f"{cluster.url}/v1/completions", json=body, timeout=60).json()
        assert plain["choices"][0]["text"] == tokenizer.decode(want["token_ids"])
        streamed = httpx.post(f"{cluster.url}/v1/completions", json={**body, "stream": True}, timeout=60)
        chunks = [line[6:] for line in streamed.text.splitlines() if line.startswith("data: {")]
        text_out = "".join(httpx.Response(200, content=c).json()["choices"][0]["text"] for c in chunks)
        assert text_out == plain["choices"][0]["text"]
    finally:
        assert cluster.stop() == 0, cluster.logs()
