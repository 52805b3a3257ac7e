"""The worker runtime (common/worker) and common/engine_args, without a model: flags, config validation,
abort memory, addresses, the service's command dispatch, the waker, and the channels over real ZMQ
sockets."""

from __future__ import annotations

import argparse
import threading
import time

import msgpack
import pytest
import zmq

from common.config import EngineConfig
from common.engine_args import add_engine_args, engine_argv, engine_config_from_args, engine_overrides
from common.net.addresses import resolve_host, split_tcp_address
from common.net.waker import Waker
from common.wire.messages import (
    Abort,
    PrefillRequest,
    RequestFailed,
    Shutdown,
    TokenOutput,
    WorkerHeartbeat,
    WorkerRegister,
    encode,
)
from common.wire.sampling_params import SamplingParams
from common.worker.aborts import AbortBook
from common.worker.channels import WorkerChannels
from common.worker.config import WorkerConfig, parse_worker_args
from common.worker.role import LoadReport
from common.worker.service import WorkerService
from prefill_worker.role import PrefillRole
from tests.helpers.fake_router import receive, registration


def parse(argv: list[str]) -> argparse.Namespace:
    return add_engine_args(argparse.ArgumentParser()).parse_args(argv)


# ---- engine flags ---------------------------------------------------------------------------------


def test_engine_flags_fill_engine_config() -> None:
    argv = ["--max-num-seqs", "8", "--num-kvcache-blocks", "32", "--enforce-eager", "--no-prefix-caching"]
    argv += ["--dtype", "float32", "--cpu-kvcache-gb", "0.5", "--seed", "3"]
    args = parse(argv)
    args.model = "/m"
    cfg = engine_config_from_args(args, "decode")
    assert (cfg.role, cfg.max_num_seqs, cfg.num_kvcache_blocks, cfg.seed) == ("decode", 8, 32, 3)
    assert cfg.enforce_eager is True and cfg.enable_prefix_caching is False
    assert cfg.dtype == "float32" and cfg.cpu_kvcache_gb == 0.5
    assert cfg.max_num_batched_tokens == EngineConfig("/m").max_num_batched_tokens  # untouched default


def test_engine_argv_round_trips_only_what_was_given() -> None:
    argv = ["--max-model-len", "512", "--no-prefix-caching", "--gpu-memory-utilization", "0.3"]
    overrides = engine_overrides(parse(argv))
    assert overrides == {"max_model_len": 512, "enable_prefix_caching": False, "gpu_memory_utilization": 0.3}
    assert engine_overrides(parse(engine_argv(overrides))) == overrides
    assert engine_argv({}) == []
    with pytest.raises(ValueError, match="not engine flags: bogus"):
        engine_argv({"bogus": 1})


def test_multiplexed_mode_flags_reach_the_config() -> None:
    """The measured inline rule is off unless asked for; the limit passes through."""
    argv = [
        "--pd-multiplex",
        "--mux-inline-measured",
        "--mux-inline-prompt-tokens",
        "256",
        "--mux-split",
        "knee",
        "--itl-target-solo-ratio",
        "2",
    ]
    args = parse(argv)
    args.model = "/m"
    cfg = engine_config_from_args(args, "mixed")
    assert cfg.pd_multiplex and cfg.mux_inline_measured is True and cfg.mux_inline_prompt_tokens == 256
    assert cfg.mux_split == "knee" and cfg.itl_target_solo_ratio == 2.0
    assert engine_overrides(parse(engine_argv(engine_overrides(args)))) == engine_overrides(args)
    default = parse(["--pd-multiplex"])
    default.model = "/m"
    assert engine_config_from_args(default, "mixed").mux_inline_measured is False
    assert engine_config_from_args(default, "mixed").mux_split == "target"
    assert engine_config_from_args(default, "mixed").itl_target_solo_ratio == 2.0  # 2 x the solo gap
    fixed = parse(["--pd-multiplex", "--itl-target-solo-ratio", "0"])
    fixed.model = "/m"
    assert engine_config_from_args(fixed, "mixed").itl_target_solo_ratio == 0  # the fixed target alone
    drain = parse(["--pd-multiplex", "--mux-split", "drain", "--itl-target-solo-ratio", "2"])
    drain.model = "/m"
    assert engine_config_from_args(drain, "mixed").itl_target_solo_ratio == 2.0


def test_bad_engine_values_name_the_field() -> None:
    args = parse(["--kvcache-block-size", "3"])
    args.model = "/m"
    with pytest.raises(ValueError, match="kvcache_block_size"):
        engine_config_from_args(args, "prefill")


def test_worker_cli_rejects_bad_values(tmp_path, capsys) -> None:
    (tmp_path / "config.json").write_text("{}")
    base = ["--model", str(tmp_path), "--router-addr", "tcp://127.0.0.1:5555"]
    config, level = parse_worker_args([*base, "--worker-id", "p0", "--max-num-seqs", "4"], ("prefill",))
    assert (config.worker_id, config.role, config.engine.max_num_seqs, level) == ("p0", "prefill", 4, "info")
    assert config.node_id is None  # named only by a backend that knows the node (Ray)
    assert parse_worker_args([*base, "--node-id", "n1"], ("prefill",))[0].node_id == "n1"
    for bad, field in ([["--host", "0.0.0.0"], "host"], [["--kv-lease-s", "-1"], "kv_lease_s"]):
        with pytest.raises(SystemExit) as exc:
            parse_worker_args([*base, *bad], ("prefill",))
        assert exc.value.code == 2 and field in capsys.readouterr().err


def test_worker_config_validation() -> None:
    engine = EngineConfig("/m", role="decode")
    assert WorkerConfig("d0", "tcp://h:1", engine).served_model_name == "m"
    with pytest.raises(ValueError, match="router_addr"):
        WorkerConfig("d0", "h:1", engine)
    assert WorkerConfig("m0", "tcp://h:1", EngineConfig("/m", role="mixed")).role == "mixed"


def test_worker_cli_role_picks_among_the_modules_roles(tmp_path, capsys) -> None:
    (tmp_path / "config.json").write_text("{}")
    base = ["--model", str(tmp_path), "--router-addr", "tcp://127.0.0.1:5555"]
    roles = ("decode", "mixed")
    assert parse_worker_args(base, roles)[0].role == "decode"  # the module's first role by default
    config, _ = parse_worker_args([*base, "--role", "mixed"], roles)
    assert (config.role, config.engine.role) == ("mixed", "mixed")
    assert config.worker_id.startswith("mixed-")
    with pytest.raises(SystemExit) as exc:
        parse_worker_args([*base, "--role", "prefill"], roles)  # the decode module cannot be one
    assert exc.value.code == 2 and "--role" in capsys.readouterr().err


# ---- abort memory, addresses ----------------------------------------------------------------------


def test_abort_book_remembers_for_a_while() -> None:
    book = AbortBook(ttl_s=10, capacity=2)
    book.remember("a", now=0)
    book.remember("a", now=1)  # idempotent, refreshes
    assert book.was_aborted("a", now=5) and not book.was_aborted("b", now=5)
    assert not book.was_aborted("a", now=12)
    book.remember("b", now=2)
    book.remember("c", now=3)  # over capacity: the oldest goes
    assert len(book) == 2 and not book.was_aborted("a", now=4)
    book.expire(now=100)
    assert len(book) == 0


def test_addresses() -> None:
    assert split_tcp_address("tcp://10.0.0.1:41234") == ("10.0.0.1", 41234)
    assert split_tcp_address("tcp://[::1]:5") == ("::1", 5)
    with pytest.raises(ValueError, match="tcp://host:port"):
        split_tcp_address("10.0.0.1:5")
    assert resolve_host("auto", "tcp://127.0.0.1:5555") == "127.0.0.1"
    assert resolve_host("10.1.2.3", "tcp://127.0.0.1:5555") == "10.1.2.3"


# ---- the service's dispatch -----------------------------------------------------------------------


class RecordingRole(PrefillRole):
    """PrefillRole's dispatch surface without an engine: records what reaches it."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def submit(self, msg) -> None:
        self.seen.append(f"submit {msg.request_id}")

    def abort(self, request_id: str) -> bool:
        self.seen.append(f"abort {request_id}")
        return False


def service_with_recording_role() -> WorkerService:
    config = WorkerConfig("p0", "tcp://127.0.0.1:9", EngineConfig("/m", role="prefill"))
    return WorkerService(config, RecordingRole())


def test_abort_before_request_drops_the_late_request() -> None:
    service = service_with_recording_role()
    service.handle(Abort("r1"))
    service.handle(Abort("r1"))
    service.handle(PrefillRequest("r1", [1, 2], {}, "d0", "tcp://127.0.0.1:9", None))
    service.handle(PrefillRequest("r2", [1, 2], {}, "d0", "tcp://127.0.0.1:9", None))
    assert service.role.seen == ["abort r1", "abort r1", "submit r2"]


def test_shutdown_message_stops_the_loop_and_strays_are_ignored() -> None:
    service = service_with_recording_role()
    service.handle(TokenOutput("x", "w", 0, [1], None, 1, 0))  # not a command: logged, ignored
    assert not service.stopping
    service.handle(Shutdown("bye"))
    assert service.stopping


# ---- channels over real sockets -------------------------------------------------------------------


def test_channels_register_heartbeat_and_survive_garbage(router_inbox) -> None:
    inbox, inbox_addr = router_inbox
    channels = WorkerChannels("p0", inbox_addr, "127.0.0.1", with_events=True, heartbeat_interval_s=0.05)
    bound = channels.start()
    try:
        assert bound.command_addr.startswith("tcp://127.0.0.1:") and bound.events_addr
        channels.load = LoadReport(num_free_blocks=7, num_total_blocks=8)
        channels.register(registration(bound.command_addr, bound.events_addr))
        assert receive(inbox, WorkerRegister).command_addr == bound.command_addr
        heartbeat = receive(inbox, WorkerHeartbeat)
        assert (heartbeat.num_free_blocks, heartbeat.num_total_blocks) == (7, 8)
        ctx = zmq.Context.instance()
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.connect(bound.command_addr)
        for garbage in (b"\xff\x00", msgpack.packb({"type": "abort"}), msgpack.packb([1, 2])):
            push.send(garbage)
        push.send(encode(Abort("r1")))
        assert channels.inbox.get(timeout=5) == Abort("r1")  # the garbage was dropped, not delivered
        channels.to_front(None, TokenOutput("r1", "p0", 0, [5], "stop", 1, 0))
        assert receive(inbox, TokenOutput).token_ids == [5]
        push.close(linger=0)
    finally:
        channels.close()
        channels.close()  # idempotent


def test_a_malformed_request_is_failed_back_to_the_router(router_inbox) -> None:
    inbox, inbox_addr = router_inbox
    channels = WorkerChannels("p0", inbox_addr, "127.0.0.1", with_events=False)
    bound = channels.start()
    push = zmq.Context.instance().socket(zmq.PUSH)
    try:
        push.setsockopt(zmq.LINGER, 0)
        push.connect(bound.command_addr)
        good = encode(PrefillRequest("r1", [1, 2], SamplingParams(), "d", "tcp://127.0.0.1:9", None))
        bad = msgpack.unpackb(good)
        bad["sampling"]["max_tokens"] = 0
        push.send(msgpack.packb(bad))
        failed = receive(inbox, RequestFailed)
        assert (failed.request_id, failed.worker_id, failed.retryable) == ("r1", "p0", False)
        assert "sampling" in failed.error and "max_tokens" in failed.error
        push.send(msgpack.packb({**bad, "request_id": 7}))  # no usable id: nothing to answer, dropped
        push.send(good)
        assert channels.inbox.get(timeout=5).request_id == "r1"
        assert not inbox.poll(200)  # frames are handled in order: the id-less one was only dropped
    finally:
        push.close(linger=0)
        channels.close()


def test_waker_interrupts_a_poll_from_another_thread() -> None:
    waker = Waker()
    poller = zmq.Poller()
    poller.register(waker.fd, zmq.POLLIN)
    try:
        assert poller.poll(0) == []
        threading.Timer(0.05, waker.wake).start()
        t0 = time.monotonic()
        assert dict(poller.poll(5000)) == {waker.fd: zmq.POLLIN}
        assert time.monotonic() - t0 < 2
        for _ in range(100_000):  # more wake-ups than the pipe holds: never blocks, never raises
            waker.wake()
        waker.drain()
        assert poller.poll(0) == []
    finally:
        waker.close()
    waker.wake()  # after close: a no-op, not an error


def test_gpu_share_sizing_ignores_other_processes() -> None:
    from common.worker.engine_factory import blocks_for_share

    gib = 2**30
    # 0.3 of 100 GiB, 2 GiB held by this process, 1 GiB reserve, 1 MiB blocks
    assert blocks_for_share(100 * gib, 0.3, 2 * gib, gib, 2**20) == 27 * 1024
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        blocks_for_share(100 * gib, 0.01, 2 * gib, 0, 2**20)
