"""One worker process (`python -m {prefill,decode}_worker`, tiny random model) against a stand-in router
inbox: registration and its parity fields, heartbeats, snapshots, garbage on the command socket, a
mixed worker generating over its real command socket (its start-up heap frozen out of the collector's
scans, its stats lines counting collections), and a clean exit (status 0) on Shutdown and on
SIGTERM; with `--worker-io process`, the same generation through the channel process, and a worker
whose channel process dies exits instead of serving deaf."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest
import zmq

from common import LLM, SamplingParams
from common.wire.cache_messages import Snapshot, SnapshotRequest
from common.wire.hashing import block_hashes, probe_hash
from common.wire.messages import (
    Abort,
    GenerateRequest,
    Shutdown,
    TokenBatch,
    TokenOutput,
    WorkerHeartbeat,
    WorkerRegister,
    decode,
    encode,
)
from tests.helpers.channel_process import channel_process
from tests.integration.launcher import REPO_ROOT

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def inbox():
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    pull.bind("tcp://127.0.0.1:*")
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    yield pull, push
    pull.close(linger=0)
    push.close(linger=0)
    ctx.term()


def start_worker(
    module: str, model: str, router_addr: str, role: str | None = None, *extra: str
) -> subprocess.Popen:
    role = role or module
    cmd = [sys.executable, "-m", f"{module}_worker", "--model", model, "--router-addr", router_addr]
    cmd += [
        "--role",
        role,
        "--worker-id",
        f"{role}-x",
        "--num-kvcache-blocks",
        "16",
        "--log-level",
        "warning",
        *extra,
    ]
    return subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def receive(sock: zmq.Socket, kind: type | tuple[type, ...], proc: subprocess.Popen, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        if sock.poll(100):
            msg = decode(sock.recv())
            if isinstance(msg, kind):
                return msg
    raise AssertionError(f"no {kind} from the worker")


def test_decode_worker_registers_and_exits_on_shutdown(tiny_model_dirs, inbox) -> None:
    pull, push = inbox
    proc = start_worker("decode", tiny_model_dirs["qwen2"], pull.getsockopt_string(zmq.LAST_ENDPOINT))
    try:
        reg = receive(pull, WorkerRegister, proc)
        assert (reg.worker_id, reg.role, reg.pid, reg.events_addr) == ("decode-x", "decode", proc.pid, None)
        assert reg.block_size == 16 and reg.probe_hash == probe_hash(16) and reg.num_kv_blocks == 16
        assert reg.kv_endpoint == {"transports": ["tcp"], "kv_dtype": "float32"}  # the CPU default dtype
        assert receive(pull, WorkerHeartbeat, proc).num_total_blocks == 16
        assert (
            receive(pull, WorkerRegister, proc, timeout=5) == reg
        )  # re-sent: a restarted router re-learns it
        push.connect(reg.command_addr)
        push.send(b"\x00garbage")
        push.send(encode(Abort("never-seen")))
        push.send(encode(Shutdown("test over")))
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()
        proc.wait()


def test_prefill_worker_answers_snapshots_and_exits_on_sigterm(tiny_model_dirs, inbox) -> None:
    pull, push = inbox
    proc = start_worker("prefill", tiny_model_dirs["qwen2"], pull.getsockopt_string(zmq.LAST_ENDPOINT))
    try:
        reg = receive(pull, WorkerRegister, proc)
        assert reg.role == "prefill" and reg.events_addr.startswith("tcp://127.0.0.1:")
        push.connect(reg.command_addr)
        push.send(encode(SnapshotRequest("prefill-x")))
        snap = receive(pull, Snapshot, proc)
        assert (snap.worker_id, snap.seq, snap.hashes) == ("prefill-x", 0, [])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()
        proc.wait()


def test_mixed_worker_generates_over_its_command_socket(tiny_model_dirs, inbox) -> None:
    pull, push = inbox
    model = tiny_model_dirs["qwen2"]
    addr = pull.getsockopt_string(zmq.LAST_ENDPOINT)
    stats = ("--log-level", "info", "--log-stats-interval", "0.001")  # a stats line for each busy turn
    proc = start_worker("decode", model, addr, "mixed", *stats)
    try:
        reg = receive(pull, WorkerRegister, proc)
        assert (reg.worker_id, reg.role) == ("mixed-x", "mixed")
        assert reg.events_addr.startswith("tcp://127.0.0.1:")  # its cache is published like a prefill's
        push.connect(reg.command_addr)
        prompt = [(i * 37 + 11) % 500 for i in range(40)]
        params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
        push.send(encode(GenerateRequest("g1", prompt, params, None)))
        outs: list[TokenOutput] = []
        while not outs or outs[-1].finish_reason is None:  # mid-stream tokens come as batch rows
            msg = receive(pull, (TokenOutput, TokenBatch), proc)
            outs += msg.outputs() if isinstance(msg, TokenBatch) else [msg]
        assert [o.index for o in outs][0] == 0 and outs[-1].finish_reason == "length"
        expected = LLM(model, num_kvcache_blocks=16).generate([prompt], params, use_tqdm=False)
        assert [t for o in outs for t in o.token_ids] == expected[0]["token_ids"]
        push.send(encode(SnapshotRequest("mixed-x")))
        assert set(block_hashes(prompt, 16)) <= set(receive(pull, Snapshot, proc).hashes)
        push.send(encode(Shutdown("test over")))
        assert proc.wait(timeout=20) == 0
        log = proc.stdout.read()
        # Start-up's objects (torch's and the model's modules) are frozen out of the collector's scans,
        # and the stats lines count the collections that still run.
        frozen = re.search(r"(\d+) start-up objects frozen", log)
        assert frozen and int(frozen[1]) > 50_000, log
        assert re.search(r"gc \d+ collections \(\d+ full\), [0-9.]+ ms, longest [0-9.]+ ms", log), log
    finally:
        proc.kill()
        proc.wait()


def test_a_process_io_worker_generates_and_exits_when_its_channel_dies(tiny_model_dirs, inbox) -> None:
    pull, push = inbox
    model = tiny_model_dirs["qwen2"]
    addr = pull.getsockopt_string(zmq.LAST_ENDPOINT)
    proc = start_worker("decode", model, addr, "mixed", "--worker-io", "process")
    try:
        reg = receive(pull, WorkerRegister, proc)
        push.connect(reg.command_addr)
        prompt = [(i * 29 + 5) % 500 for i in range(33)]
        params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
        push.send(encode(GenerateRequest("p1", prompt, params, None)))
        outs: list[TokenOutput] = []
        while not outs or outs[-1].finish_reason is None:
            msg = receive(pull, (TokenOutput, TokenBatch), proc)
            outs += msg.outputs() if isinstance(msg, TokenBatch) else [msg]
        expected = LLM(model, num_kvcache_blocks=16).generate([prompt], params, use_tqdm=False)
        assert [t for o in outs for t in o.token_ids] == expected[0]["token_ids"]
        os.kill(channel_process(proc.pid), signal.SIGKILL)
        assert proc.wait(timeout=20) != 0  # a worker that cannot hear or answer the router must go
        assert "channel process is gone" in proc.stdout.read()
    finally:
        proc.kill()
        proc.wait()
