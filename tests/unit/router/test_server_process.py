"""`python -m router` as a real process: ready file, OpenAI client, disconnect -> Abort; and no torch."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from common.wire.messages import Abort
from tests.unit.router.fake_workers import Script, start_workers
from tests.unit.router.harness import wait_for
from tests.unit.router.router_process import REPO_ROOT, router_process

ROUTER_MODULES = [
    "router",
    "router.__main__",
    "router.app",
    "router.server",
    "router.cluster_client",
    "router.request_lifecycle",
    "router.tokenizer",
    "common.wire.detokenizer",
    "common.wire.blocks",
    "router.prefix_index",
    "router.policy",
    "common.wire.messages",
]


def test_router_never_imports_torch() -> None:
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in ROUTER_MODULES)
        + "bad = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
        + "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True, timeout=60)


def test_cli_rejects_bad_arguments(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "router", "--model", str(tmp_path), "--port", "70000"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "port" in r.stderr


@pytest.fixture
def router(model_dir: Path, tmp_path: Path):
    with router_process(model_dir, tmp_path) as info:
        yield info


def test_openai_client_streams_and_disconnect_aborts(router, tokenizer) -> None:
    openai = pytest.importorskip("openai")
    reply = tokenizer.encode(" one two three four five six seven eight", add_special_tokens=False)
    slow = Script(reply=reply, token_delay=0.05)

    async def main():
        workers = await start_workers(
            router["inbox"], [("p0", "prefill", Script(reply=reply)), ("d0", "decode", slow)]
        )
        try:
            base = router["http"]
            async with httpx.AsyncClient(base_url=base) as http:

                async def healthy() -> bool:
                    return (await http.get("/health")).status_code == 200

                deadline = time.monotonic() + 10
                while not await healthy():
                    assert time.monotonic() < deadline, "router never became healthy"
                    await asyncio.sleep(0.05)
            client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="none")
            stream = await client.chat.completions.create(
                model=router["model"],
                messages=[{"role": "user", "content": "count"}],
                max_tokens=len(reply),
                stream=True,
            )
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            assert text == tokenizer.decode(reply)
            completion = await client.completions.create(model=router["model"], prompt="x", max_tokens=3)
            assert completion.usage.completion_tokens == 3
            with pytest.raises(openai.BadRequestError) as bad:
                await client.completions.create(model=router["model"], prompt="x", temperature=-1)
            assert bad.value.body["param"] == "temperature"
            # disconnect mid-stream: the router must abort both workers
            async with httpx.AsyncClient(base_url=base) as http:
                body = {"prompt": "y", "max_tokens": 50, "stream": True}
                async with http.stream("POST", "/v1/completions", json=body) as response:
                    async for _ in response.aiter_lines():
                        break
            for w in workers:
                await wait_for(lambda w=w: w.of_type(Abort), timeout=5, what=f"abort on {w.worker_id}")
        finally:
            for w in workers:
                await w.stop()

    asyncio.run(main())
