"""Drive real worker services in-process: real engines (tiny models) and KV transports, fake channels.

`FakeChannels` stands in for the ZMQ I/O thread: commands are put on `inbox` by the test, and what a
role sends is recorded. `Pair` wires a prefill and a decode service together by forwarding the
prefill side's DecodeRequests, which is the whole cluster minus the router and the sockets.
"""

from __future__ import annotations

import queue
import time

from common.config import EngineConfig
from common.wire.messages import DecodeRequest, Message, PrefillRequest, TokenBatch, TokenOutput
from common.wire.sampling_params import SamplingParams
from common.worker.config import WorkerConfig
from common.worker.engine_factory import build_engine
from common.worker.role import LoadReport, WorkerContext, WorkerRole
from common.worker.service import WorkerService
from decode_worker.role import DecodeRole
from prefill_worker.role import PrefillRole


class FakeChannels:
    def __init__(self) -> None:
        self.inbox: queue.Queue[Message] = queue.Queue()
        self.load = LoadReport()
        self.router: list[Message] = []
        self.reply_tos: list[str | None] = []  # the front each message in `router` went to
        self.peers: list[tuple[str, Message]] = []
        self.events: list[Message] = []

    def to_front(self, reply_to: str | None, msg: Message) -> None:
        self.router.append(msg)
        self.reply_tos.append(reply_to)

    def to_peer(self, command_addr: str, msg: Message) -> None:
        self.peers.append((command_addr, msg))

    def publish(self, msg: Message) -> None:
        self.events.append(msg)

    def hold_wakes(self) -> None:  # nothing to wake: the messages above are recorded at once
        pass

    def release_wakes(self) -> None:
        pass

    def of_type(self, cls: type) -> list:
        """Messages of `cls` sent to the router; asked for TokenOutputs, a TokenBatch counts as its
        rows, in order (what the router itself does with one)."""
        out = []
        for m in self.router:
            if cls is TokenOutput and isinstance(m, TokenBatch):
                out += m.outputs()
            elif isinstance(m, cls):
                out.append(m)
        return out

    def close(self) -> None:
        pass


def make_service(role: WorkerRole, model: str, **overrides) -> WorkerService:
    """A started service (engine loaded, role's KV side running) on FakeChannels."""
    kv = {k: overrides.pop(k) for k in ("kv_lease_s", "kv_fetch_timeout_s") if k in overrides}
    engine_cfg = EngineConfig(model=model, role=role.name, **{"num_kvcache_blocks": 64, **overrides})
    config = WorkerConfig(f"{role.name}-test", "tcp://127.0.0.1:9", engine_cfg, host="127.0.0.1", **kv)
    service = WorkerService(config, role)
    service.engine = build_engine(engine_cfg)
    service.channels = FakeChannels()
    role.start(WorkerContext(config, service.engine, service.channels, "127.0.0.1"))
    return service


def prefill_request(rid: str, prompt: list[int], deadline: float | None = None, **sampling) -> PrefillRequest:
    params = SamplingParams(**{"temperature": 0.0, "max_tokens": 8, **sampling})
    return PrefillRequest(rid, prompt, params, "decode-test", "tcp://127.0.0.1:9", deadline)


def run_until(services: list[WorkerService], done, timeout: float = 30.0, between=None) -> None:
    """Turn the services' loops until `done()`; `between()` runs after each round."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        for service in services:
            service.run_once()
        if between is not None:
            between()


class Pair:
    """A prefill and a decode service connected the way the cluster connects them."""

    def __init__(self, prefill: WorkerService, decode: WorkerService) -> None:
        self.prefill, self.decode = prefill, decode

    @classmethod
    def of(cls, model: str, kv_fetch_timeout_s: float) -> Pair:
        """A fresh prefill role and decode role on `model`."""
        return cls(
            make_service(PrefillRole(), model),
            make_service(DecodeRole(), model, kv_fetch_timeout_s=kv_fetch_timeout_s),
        )

    def forward(self) -> None:
        peers = self.prefill.channels.peers
        while peers:
            _, msg = peers.pop(0)
            assert isinstance(msg, DecodeRequest)
            self.decode.channels.inbox.put(msg)

    def outputs(self) -> list[TokenOutput]:
        return self.prefill.channels.of_type(TokenOutput) + self.decode.channels.of_type(TokenOutput)

    def finished(self, rid: str) -> bool:
        return any(o.request_id == rid and o.finish_reason is not None for o in self.outputs())

    def tokens(self, rid: str) -> list[int]:
        """The request's completion, ordered by index as the router orders it."""
        outs = sorted((o for o in self.outputs() if o.request_id == rid), key=lambda o: o.index)
        return [t for o in outs for t in o.token_ids]

    def run(self, rids: list[str], timeout: float = 60.0) -> None:
        run_until([self.prefill, self.decode], lambda: all(map(self.finished, rids)), timeout, self.forward)

    def close(self) -> None:
        self.prefill.close()
        self.decode.close()
