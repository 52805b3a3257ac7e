"""The router stand-in of benchmarks/serving/worker_host.py, run in its own process.

It binds an inbox (the worker's router address), waits for the worker's registration, subscribes to
its cache events like the router does, then keeps `concurrency` GenerateRequests in flight (random
prompt ids, a new request each time one finishes) until `num_requests` have been sent and answered,
and ends the worker with a Shutdown. It reads every TokenBatch / TokenOutput so the worker's sends
are drained exactly as a router front drains them. Its own process, because the router is one: its
Python work must not share the worker's GIL.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import zmq

from common.net.sockets import last_endpoint, open_sockets
from common.wire.messages import (
    GenerateRequest,
    RequestFailed,
    Shutdown,
    TokenBatch,
    TokenOutput,
    WorkerRegister,
    decode,
    encode,
)
from common.wire.sampling_params import SamplingParams

REGISTER_TIMEOUT_S = 300.0  # the worker loads its (tiny) model first


@dataclass(frozen=True)
class DriverPlan:
    num_requests: int
    concurrency: int
    prompt_len: int
    output_len: int
    vocab_size: int
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_requests", "concurrency", "prompt_len", "output_len", "vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")


class Driver:
    def __init__(self, plan: DriverPlan) -> None:
        self.plan = plan
        self.rng = random.Random(plan.seed)
        self.params = SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=plan.output_len)
        self.sent = self.finished = self.failed = self.tokens = self.event_batches = 0

    def run(self, announce) -> dict:
        """`announce(inbox address)` tells the parent where the worker must register."""
        sockets = open_sockets(None, "worker-host-driver")
        try:
            inbox = sockets.bind(zmq.PULL, "127.0.0.1")
            announce(last_endpoint(inbox))
            reg = self._await_registration(inbox)
            push = sockets.dial(zmq.PUSH, reg.command_addr)
            events = sockets.dial(zmq.SUB, reg.events_addr) if reg.events_addr else None
            t0 = time.perf_counter()
            self._serve(inbox, push, events)
            elapsed = time.perf_counter() - t0
            push.send(encode(Shutdown("worker_host benchmark over")))
            time.sleep(0.2)  # let the Shutdown leave before the sockets close
        finally:
            sockets.close()
        return {
            "sent": self.sent,
            "finished": self.finished,
            "failed": self.failed,
            "tokens": self.tokens,
            "event_batches": self.event_batches,
            "seconds": elapsed,
        }

    def _await_registration(self, inbox: zmq.Socket) -> WorkerRegister:
        deadline = time.monotonic() + REGISTER_TIMEOUT_S
        while time.monotonic() < deadline:
            if inbox.poll(100):
                msg = decode(inbox.recv())
                if isinstance(msg, WorkerRegister):
                    return msg
        raise TimeoutError("the worker never registered")

    def _serve(self, inbox: zmq.Socket, push: zmq.Socket, events: zmq.Socket | None) -> None:
        poller = zmq.Poller()
        poller.register(inbox, zmq.POLLIN)
        if events is not None:
            poller.register(events, zmq.POLLIN)
        for _ in range(min(self.plan.concurrency, self.plan.num_requests)):
            self._send_one(push)
        while self.finished + self.failed < self.plan.num_requests:
            ready = dict(poller.poll(1000))
            if events is not None and events in ready:
                while events.poll(0):
                    events.recv()
                    self.event_batches += 1
            if inbox in ready:
                self._drain_inbox(inbox, push)

    def _drain_inbox(self, inbox: zmq.Socket, push: zmq.Socket) -> None:
        while True:
            try:
                msg = decode(inbox.recv(zmq.NOBLOCK), trusted=(TokenBatch, TokenOutput))
            except zmq.Again:
                return
            if isinstance(msg, TokenBatch):
                self.tokens += sum(len(ids) for ids in msg.token_ids)
            elif isinstance(msg, TokenOutput):
                self.tokens += len(msg.token_ids)
                if msg.finish_reason is not None:
                    self.finished += 1
                    self._send_one(push)
            elif isinstance(msg, RequestFailed):
                self.failed += 1
                self._send_one(push)

    def _send_one(self, push: zmq.Socket) -> None:
        plan = self.plan
        if self.sent >= plan.num_requests:
            return
        prompt = [self.rng.randrange(plan.vocab_size) for _ in range(plan.prompt_len)]
        push.send(encode(GenerateRequest(f"r{self.sent}", prompt, self.params, None)))
        self.sent += 1


def drive(plan: DriverPlan, conn) -> None:
    """Process entry point: announces the inbox on `conn`, then sends the driver's figures on it."""
    try:
        conn.send(Driver(plan).run(conn.send))
    except Exception as e:  # the parent must not wait forever on a driver that broke
        conn.send({"error": f"{type(e).__name__}: {e}"})
    finally:
        conn.close()
