"""The README's example request, sent exactly as README.md shows it, to a real cluster on the CPU.

It sets no temperature, so what it gets is the model's own generation config (`--generation-config
auto`, the default): the answer must name Paris, and be the one the offline engine gives under those
same defaults (which tells the model's defaults from a lucky draw at temperature 1).
"""

from __future__ import annotations

import json
import re
import shlex
from typing import NamedTuple

import httpx
import pytest

from common.wire.generation_config import load_generation_defaults
from common.wire.sampling_params import SamplingParams
from tests.integration.launcher import REPO_ROOT, LaunchedCluster, launch

pytestmark = pytest.mark.timeout(300)


class CurlExample(NamedTuple):
    path: str
    headers: dict[str, str]
    body: bytes


def readme_curl_example() -> CurlExample:
    """The first `curl` command in README.md's code blocks, parsed as the shell would."""
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    command = next(b for b in blocks if b.lstrip().startswith("curl")).replace("\\\n", " ")
    args = shlex.split(command)
    url = next(a for a in args if "/v1/" in a)
    headers = dict(
        tuple(part.strip() for part in args[i + 1].split(":", 1)) for i, a in enumerate(args) if a == "-H"
    )
    body = args[args.index("-d") + 1].encode()
    return CurlExample("/v1/" + url.split("/v1/", 1)[1], headers, body)


@pytest.fixture(scope="module")
def cluster(model_dir, tmp_path_factory) -> LaunchedCluster:
    log_dir = tmp_path_factory.mktemp("readme-cluster-logs")
    launched = launch(model_dir, log_dir, "--prefill", "1", "--decode", "1", "--kv-transport", "tcp")
    try:
        yield launched
    finally:
        assert launched.stop() == 0, launched.logs()


def test_the_readme_example_is_what_this_test_sends() -> None:
    example = readme_curl_example()
    body = json.loads(example.body)
    assert example.path == "/v1/chat/completions"
    assert body["messages"] == [{"role": "user", "content": "What is the capital of France?"}]
    assert "temperature" not in body  # the point: a new user's request sets no sampling


def test_the_readme_example_answers_paris(cluster, offline, tokenizer, model_dir: str) -> None:
    example = readme_curl_example()
    r = httpx.post(f"{cluster.url}{example.path}", headers=example.headers, content=example.body, timeout=120)
    assert r.status_code == 200, r.text
    answer = r.json()["choices"][0]["message"]["content"]
    assert "Paris" in answer, answer

    body = json.loads(example.body)
    defaults = load_generation_defaults("auto", model_dir)
    sampling = SamplingParams(max_tokens=body["max_tokens"], **defaults.fill({}))
    prompt = tokenizer.encode_chat(body["messages"], add_generation_prompt=True)
    (want,) = offline.generate([prompt], sampling, use_tqdm=False)
    assert answer == tokenizer.decode(want["token_ids"])
