"""The cluster on the GPU answers greedy chat requests exactly as the offline engine does (issue 10).

Each setup is one real cluster (`deploy.launch --backend local`: router and workers as processes; with
PDSERVE_GPU_TEST_BACKEND=ray the workers are Ray actors on a local Ray instance), started on first
use, asked every prompt, and stopped before the next setup starts, so one cluster holds the GPUs at a
time and each starts once:

  ipc       1 prefill + 1 decode, KV over CUDA IPC (one GPU: one multiplexed worker, the one-GPU P||D
            mode; two: one each)
  ipc-two   as ipc, always two worker processes (--no-pd-multiplex: half a GPU each on one GPU)
  ipc-mps   as ipc-two, the workers under the launcher's private MPS daemon (--mps)
  nccl      1 prefill + 1 decode on two GPUs, KV over NCCL (skipped with fewer than two GPUs)
  mixed     --prefill 0 --decode 0 --mixed 2: each request served whole by a mixed worker
  auto      1 prefill + 1 decode, --disagg auto: the router decides per request
  ipc-bf16  as ipc, in bfloat16

Prompts: six short chat questions and four sharing a long system prompt. The first of those four is
asked alone, then the other nine at once, so the workers batch them and the shared prefix comes from
the prefix cache. The offline `LLM` (same engine flags and dtype, on this GPU) answers the same prompts
in the same two rounds. Answers are compared through their text (the API returns no token ids); a
difference is located at the first offline token the cluster's text does not continue with.

Run on a CUDA host where the default model can be prepared (`python -m common.tools.default_model`); keep
the file in one pytest process (no xdist, or `--dist loadfile`), else setups start twice:
    PYTHONPATH=$PWD python -m pytest -q -rs tests/integration/test_cluster_gpu.py
"""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest
import torch

from common.engine_args import engine_argv
from common.tools.default_model import resolve_model
from tests.integration.greedy_parity import ClusterAnswer, Divergence, OfflineReference, divergences
from tests.integration.launcher import LaunchedCluster, launch
from tests.integration.process_cluster import metric

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

MAX_TOKENS = 64
# The same setups under Ray place the workers through Ray's GPU resources (issue 26, item 6).
BACKEND = os.environ.get("PDSERVE_GPU_TEST_BACKEND", "local")
STARTUP_S = 300.0
# Engine flags of every worker and of the offline engine alike (the dtype is the setup's). A fixed KV
# cache keeps start-up independent of free memory; max_num_seqs 32 captures decode graphs for batches
# 1-32 only (at most ten requests run at once, padded to the same graph sizes as with the default).
ENGINE = {"kvcache_block_size": 16, "num_kvcache_blocks": 1024, "max_num_seqs": 32}
# bf16 keeps 8 significant bits: at this model's top logits (10-33, median 22, measured in float32 on
# a chat answer) one rounding step is 0.06-0.25, and rounding that differs with batch shapes moves
# them by a step or two over 30 layers. A cluster token the offline engine ranked more than this far
# (in logprob) below its own is no rounding flip.
BF16_NEAR_TIE = 1.0

QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors and say one thing about each.",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
    "Give me three tips for learning to program.",
    "What is 12 times 12? Show your working.",
]
SHOP = (
    "You are the assistant of Hillside Bakery, a small family bakery on Mill Street. The bakery opens "
    "at seven in the morning from Tuesday to Sunday and closes at three in the afternoon; on Mondays "
    "it is closed. It sells sourdough, rye, spelt and seeded wholemeal loaves every day, croissants "
    "and cinnamon buns on weekends only, and a fruit tart that changes with the season. Orders of more "
    "than twenty loaves need one full day of notice and a deposit of ten percent. Gluten-free bread "
    "is baked on Thursdays only, in a separate oven. Customers can pay by card or in cash; the bakery "
    "does not deliver, but orders can be picked up from the side door after closing time until five. "
    "Answer each customer politely, in at most three sentences, and never invent products or hours."
)
SHOP_QUESTIONS = [
    "When do you open on Saturdays?",
    "Do you sell rye bread?",
    "Can I order thirty loaves for tomorrow morning?",
    "Are croissants available on Mondays?",
]
PROMPTS = [[{"role": "user", "content": q}] for q in QUESTIONS] + [
    [{"role": "system", "content": SHOP}, {"role": "user", "content": q}] for q in SHOP_QUESTIONS
]
SHARED = list(range(len(QUESTIONS), len(PROMPTS)))
# The first shop question goes alone: its blocks are cached when the others sharing its prefix come.
ROUNDS = ([SHARED[0]], [i for i in range(len(PROMPTS)) if i != SHARED[0]])


def label(i: int) -> str:
    return f"prompt {i} {PROMPTS[i][-1]['content']!r}"


@dataclass(frozen=True)
class Setup:
    name: str
    flags: tuple[str, ...]
    route: str  # where every request must be prefilled: "remote", "local", or "either" (auto decides)
    dtype: str = "float32"

    def launch_flags(self) -> list[str]:
        return ["--backend", BACKEND, *self.flags, *engine_argv({**ENGINE, "dtype": self.dtype})]


ONE_EACH = ("--prefill", "1", "--decode", "1")
# On one GPU the launcher runs 1 prefill + 1 decode as one multiplexed worker, which the router sees
# as a mixed worker: every request is served where it was prefilled, no KV moves.
MULTIPLEXED = "local" if torch.cuda.device_count() == 1 else "remote"
IPC = Setup("ipc", (*ONE_EACH, "--kv-transport", "ipc", "--disagg", "always"), MULTIPLEXED)
IPC_TWO = Setup("ipc-two", (*IPC.flags, "--no-pd-multiplex"), "remote")
IPC_MPS = Setup("ipc-mps", (*IPC.flags, "--mps"), "remote")
NCCL = Setup("nccl", (*ONE_EACH, "--kv-transport", "nccl", "--disagg", "always"), "remote")
MIXED = Setup("mixed", ("--prefill", "0", "--decode", "0", "--mixed", "2"), "local")
AUTO = Setup("auto", (*ONE_EACH, "--disagg", "auto"), "either")
IPC_BF16 = Setup("ipc-bf16", IPC.flags, MULTIPLEXED, dtype="bfloat16")
local_only = pytest.mark.skipif(BACKEND != "local", reason="--mps is for --backend local")
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="nccl between workers needs two GPUs")
FLOAT32 = [pytest.param(IPC, id="ipc"), pytest.param(IPC_TWO, id="ipc-two")]
FLOAT32 += [pytest.param(IPC_MPS, id="ipc-mps", marks=local_only)]
FLOAT32 += [pytest.param(NCCL, id="nccl", marks=two_gpus)]
FLOAT32 += [pytest.param(MIXED, id="mixed"), pytest.param(AUTO, id="auto")]
EVERY = [*FLOAT32, pytest.param(IPC_BF16, id="ipc-bf16")]


@dataclass(frozen=True)
class Served:
    """What one setup's cluster answered, its /metrics afterwards, and how its launcher exited."""

    setup: Setup
    answers: list[ClusterAnswer]
    metrics: str
    cluster: LaunchedCluster
    exit_status: int | None  # None: the launcher did not stop within its grace time and was killed

    def where(self) -> str:
        return f"setup {self.setup.name} (logs in {self.cluster.log_dir})"


def ask(url: str, i: int) -> ClusterAnswer:
    body = {"messages": PROMPTS[i], "max_tokens": MAX_TOKENS, "temperature": 0}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    if r.status_code != 200:
        raise RuntimeError(f"{label(i)}: HTTP {r.status_code}: {r.text}")
    return ClusterAnswer.from_chat(r.json())


def ask_all(url: str) -> list[ClusterAnswer]:
    answers: dict[int, ClusterAnswer] = {}
    for batch in ROUNDS:
        with ThreadPoolExecutor(len(batch)) as pool:  # concurrent, so the workers batch them
            answers.update(zip(batch, pool.map(lambda i: ask(url, i), batch), strict=True))
    return [answers[i] for i in range(len(PROMPTS))]


def run_setup(setup: Setup, model: str, log_dir) -> Served:
    cluster = launch(model, log_dir, *setup.launch_flags(), timeout=STARTUP_S)
    try:
        answers = ask_all(cluster.url)
        metrics = cluster.settled_metrics(len(PROMPTS))
    except (RuntimeError, httpx.HTTPError) as e:
        raise RuntimeError(f"{e}\n{cluster.logs()}") from e
    finally:
        try:
            status = cluster.stop()
        except subprocess.TimeoutExpired:
            status = None
    return Served(setup, answers, metrics, cluster, status)


@pytest.fixture(scope="session")
def model_dir() -> str:
    """conftest's default model, except that a host which cannot prepare it skips these tests."""
    try:
        return resolve_model(None)
    except (OSError, ValueError, ImportError, RuntimeError) as e:
        pytest.skip(f"the default model cannot be prepared here ({type(e).__name__}: {e})")


@pytest.fixture(scope="module")
def serve(model_dir, tmp_path_factory):
    """serve(setup) -> Served, each setup's cluster run once (a failed start fails its tests alike)."""
    done: dict[Setup, Served | str] = {}

    def get(setup: Setup) -> Served:
        if setup not in done:
            log_dir = tmp_path_factory.mktemp(f"gpu-{setup.name}")
            try:
                done[setup] = run_setup(setup, model_dir, log_dir)
            except RuntimeError as e:
                done[setup] = f"setup {setup.name} did not serve the prompts: {e}"
        result = done[setup]
        if isinstance(result, str):
            pytest.fail(result, pytrace=False)
        return result

    return get


@pytest.fixture(scope="module")
def reference(model_dir, tokenizer) -> OfflineReference:
    prompts = [tokenizer.encode_chat(messages) for messages in PROMPTS]
    return OfflineReference(model_dir, tokenizer, prompts, ROUNDS, MAX_TOKENS, ENGINE)


def compared(served: Served, reference: OfflineReference) -> tuple[list[Divergence], str]:
    """The answers that differ from the offline engine's, and a headline for the failure message."""
    names = [label(i) for i in range(len(PROMPTS))]
    diffs = divergences(served.answers, reference, served.setup.dtype, names)
    same = len(PROMPTS) - len(diffs)
    return diffs, f"{served.where()}: {same}/{len(PROMPTS)} answers token-identical to the offline engine's"


@pytest.mark.parametrize("setup", FLOAT32)
def test_float32_answers_equal_offline_engine(serve, reference, setup) -> None:
    diffs, head = compared(serve(setup), reference)
    assert not diffs, "\n".join([head, *(d.detail for d in diffs)])


@pytest.mark.parametrize("setup", [pytest.param(IPC_BF16, id="ipc-bf16")])
def test_bfloat16_answers_equal_offline_engine_but_near_ties(serve, reference, setup) -> None:
    """bf16 rounding differs with batch shapes, so a near-tie may flip one token and the answer goes
    its own way from there. Sound criterion: every answer that differs must part at a near-tie of the
    offline engine (the cluster's token within BF16_NEAR_TIE of the offline one: a rounding flip,
    not a wrong KV cache, which parts early and far), and a majority must be identical end to end."""
    diffs, head = compared(serve(setup), reference)
    far = [d for d in diffs if d.lead is None or abs(d.lead) > BF16_NEAR_TIE]
    identical = len(PROMPTS) - len(diffs)
    assert 2 * identical > len(PROMPTS) and not far, "\n".join([head, *(d.detail for d in diffs)])


@pytest.mark.parametrize("setup", EVERY)
def test_every_request_took_the_setups_route(serve, setup) -> None:
    served = serve(setup)
    m, n = served.metrics, len(PROMPTS)
    remote = metric(m, "pdserve_disagg_decisions_total", decision="remote") or 0
    local = metric(m, "pdserve_disagg_decisions_total", decision="local") or 0
    moved = metric(m, "pdserve_kv_transfer_seconds_count") or 0
    figures = f"{served.where()}: remote {remote}, local {local}, KV transfers {moved}, of {n} requests"
    figures += f", retries {metric(m, 'pdserve_retries_total')}"
    if setup.route == "either":
        assert remote + local == n, figures
    else:
        assert (remote, local) == ((n, 0) if setup.route == "remote" else (0, n)), figures
    assert moved == remote, f"{figures} (the decode side recomputed a prompt whose KV it should have got)"
    assert served.exit_status == 0, (
        f"{served.where()}: launcher exit {served.exit_status}\n{served.cluster.logs()}"
    )


@pytest.mark.parametrize("setup", [p for p in EVERY if p.values[0].route != "either"])
def test_shared_prefix_comes_from_the_cache(serve, tokenizer, setup) -> None:
    """The shop questions asked after the first one reuse its cached system-prompt blocks (under auto a
    decode worker may prefill a prompt itself, and its cache is not in the router's index: no claim)."""
    served = serve(setup)
    first, block = tokenizer.encode_chat(PROMPTS[SHARED[0]]), ENGINE["kvcache_block_size"]
    misses = []
    for i in SHARED[1:]:
        shared = len(os.path.commonprefix([first, tokenizer.encode_chat(PROMPTS[i])])) // block * block
        assert shared >= 8 * block, f"{label(i)} shares only {shared} tokens: make SHOP longer"
        if served.answers[i].cached_tokens < shared:
            misses.append(f"{label(i)}: {served.answers[i].cached_tokens} of {shared} shared tokens cached")
    assert not misses, "\n".join([served.where(), *misses])
