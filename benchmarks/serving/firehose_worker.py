"""A worker with no model, for measuring the router (benchmarks/serving/router_throughput.py).

It speaks the real wire protocol over real ZMQ sockets: registers as a mixed worker with every router
front's inbox and heartbeats to each, answers GenerateRequest by streaming a fixed reply (every token
from index 0) to the front the request names in `reply_to`, honours Abort. Like a decode batch, every
`step_s` it emits the next token(s) of every running request, `tokens_per_message` per TokenOutput (or,
with `token_batch`, each front's mid-stream rows of the step as one TokenBatch); with step_s = 0 it
emits as fast as it can.
"""

from __future__ import annotations

import os
import time

import zmq

from common.net.sockets import last_endpoint, open_sockets
from common.wire.hashing import probe_hash
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

BLOCK_SIZE = 16
HEARTBEAT_S = 0.5
REGISTER_S = 2.0


def firehose_registration(
    worker_id: str, command_addr: str, role: str = "mixed", pid: int = 1
) -> WorkerRegister:
    """A worker of `role` that can hold any request (a huge cache and max_model_len): what a firehose
    worker registers as, and the cluster `route_plan.py` plans over."""
    return WorkerRegister(
        worker_id=worker_id,
        role=role,
        host="127.0.0.1",
        pid=pid,
        command_addr=command_addr,
        events_addr=None,
        kv_endpoint={},
        block_size=BLOCK_SIZE,
        probe_hash=probe_hash(BLOCK_SIZE),
        num_kv_blocks=1 << 20,
        max_model_len=1 << 20,
        max_num_batched_tokens=8192,
        model_name="firehose",
    )


class FirehoseWorker:
    def __init__(
        self,
        worker_id: str,
        inboxes: list[str],
        reply: list[int],
        step_s: float,
        tokens_per_message: int,
        token_batch: bool = False,
    ) -> None:
        self.worker_id = worker_id
        self.inboxes = inboxes  # every front's inbox; the first also takes requests without a reply_to
        self.reply = reply
        self.step_s = step_s
        self.tokens_per_message = tokens_per_message
        self.token_batch = token_batch  # as a real decode worker: one TokenBatch per step for mid-stream rows
        # request id -> [next index, max_tokens, prompt length, the front's PUSH socket]
        self.active: dict[str, list] = {}
        self._pushes: dict[str, zmq.Socket] = {}

    def run(self, stop) -> None:
        sockets = open_sockets(None, self.worker_id)
        self._pushes = {addr: sockets.dial(zmq.PUSH, addr) for addr in self.inboxes}
        cmd = sockets.bind(zmq.PULL, "127.0.0.1")
        reg = encode(self._registration(last_endpoint(cmd)))
        now = time.monotonic()
        next_step, next_beat, next_reg = now, now, now
        try:
            while not stop.is_set():
                wait = min(next_step if self.active else now + 0.05, next_beat) - time.monotonic()
                if cmd.poll(max(0, int(wait * 1000))) and not self._take_commands(cmd):
                    return
                now = time.monotonic()
                if now >= next_reg:
                    self._to_every_front(reg)
                    next_reg = now + REGISTER_S
                if now >= next_beat:
                    self._to_every_front(encode(self._heartbeat()))
                    next_beat = now + HEARTBEAT_S
                if self.active and now >= next_step:
                    self._step()
                    next_step = max(next_step + self.step_s, now) if self.step_s else now
        finally:
            sockets.close()

    def _to_every_front(self, data: bytes) -> None:
        for push in self._pushes.values():
            push.send(data)

    def _take_commands(self, cmd: zmq.Socket) -> bool:
        while True:
            try:
                msg = decode(cmd.recv(zmq.NOBLOCK))
            except zmq.Again:
                return True
            if isinstance(msg, GenerateRequest):
                push = (
                    self._pushes[self.inboxes[0]] if msg.reply_to is None else self._pushes.get(msg.reply_to)
                )
                if push is not None:  # else: a front this worker was not started with
                    prompt_len = len(msg.prompt_token_ids)
                    self.active[msg.request_id] = [0, msg.sampling.max_tokens, prompt_len, push]
            elif isinstance(msg, Abort):
                self.active.pop(msg.request_id, None)
            elif isinstance(msg, Shutdown):
                return False

    def _step(self) -> None:
        reply, n = self.reply, len(self.reply)
        batches: dict[zmq.Socket, tuple[list, list, list, list]] = {}  # per front: a TokenBatch's columns
        for request_id, state in list(self.active.items()):
            index, max_tokens, prompt_len, push = state
            count = min(self.tokens_per_message, max_tokens - index)
            tokens = [reply[(index + i) % n] for i in range(count)]
            state[0] = index + count
            finish = "length" if state[0] >= max_tokens else None
            if self.token_batch and not finish and index > 0:
                rows = batches.get(push) or batches.setdefault(push, ([], [], [], []))
                for column, value in zip(rows, (request_id, index, tokens, prompt_len), strict=True):
                    column.append(value)
                continue
            push.send(encode(TokenOutput(request_id, self.worker_id, index, tokens, finish, prompt_len, 0)))
            if finish:
                del self.active[request_id]
        for push, rows in batches.items():
            push.send(encode(TokenBatch(self.worker_id, *rows)))

    def _registration(self, command_addr: str) -> WorkerRegister:
        return firehose_registration(self.worker_id, command_addr, pid=os.getpid())

    def _heartbeat(self) -> WorkerHeartbeat:
        running = len(self.active)
        return WorkerHeartbeat(self.worker_id, 1 << 20, 1 << 20, 0, running, 0, time.time())
