"""A worker with no model, for measuring the router (benchmarks/serving/router_throughput.py).

It speaks the real wire protocol over real ZMQ sockets: registers as a mixed worker, heartbeats,
answers GenerateRequest by streaming a fixed reply (every token from index 0), honours Abort. Like a
decode batch, every `step_s` it emits the next token(s) of every running request, `tokens_per_message`
per TokenOutput; with step_s = 0 it emits as fast as it can.
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


class FirehoseWorker:
    def __init__(
        self,
        worker_id: str,
        inbox: str,
        reply: list[int],
        step_s: float,
        tokens_per_message: int,
        token_batch: bool = False,
    ) -> None:
        self.worker_id = worker_id
        self.inbox = inbox
        self.reply = reply
        self.step_s = step_s
        self.tokens_per_message = tokens_per_message
        self.token_batch = token_batch  # as a real decode worker: one TokenBatch per step for mid-stream rows
        self.active: dict[str, list[int]] = {}  # request id -> [next index, max_tokens, prompt length]

    def run(self, stop) -> None:
        sockets = open_sockets(None, self.worker_id)
        push = sockets.dial(zmq.PUSH, self.inbox)
        cmd = sockets.bind(zmq.PULL, "127.0.0.1")
        reg = self._registration(last_endpoint(cmd))
        now = time.monotonic()
        next_step, next_beat, next_reg = now, now, now
        try:
            while not stop.is_set():
                wait = min(next_step if self.active else now + 0.05, next_beat) - time.monotonic()
                if cmd.poll(max(0, int(wait * 1000))) and not self._take_commands(cmd):
                    return
                now = time.monotonic()
                if now >= next_reg:
                    push.send(encode(reg))
                    next_reg = now + REGISTER_S
                if now >= next_beat:
                    push.send(encode(self._heartbeat()))
                    next_beat = now + HEARTBEAT_S
                if self.active and now >= next_step:
                    self._step(push)
                    next_step = max(next_step + self.step_s, now) if self.step_s else now
        finally:
            sockets.close()

    def _take_commands(self, cmd: zmq.Socket) -> bool:
        while True:
            try:
                msg = decode(cmd.recv(zmq.NOBLOCK))
            except zmq.Again:
                return True
            if isinstance(msg, GenerateRequest):
                self.active[msg.request_id] = [0, msg.sampling.max_tokens, len(msg.prompt_token_ids)]
            elif isinstance(msg, Abort):
                self.active.pop(msg.request_id, None)
            elif isinstance(msg, Shutdown):
                return False

    def _step(self, push: zmq.Socket) -> None:
        reply, n = self.reply, len(self.reply)
        rows: tuple[list, list, list, list] = ([], [], [], [])
        for request_id, state in list(self.active.items()):
            index, max_tokens, prompt_len = state
            count = min(self.tokens_per_message, max_tokens - index)
            tokens = [reply[(index + i) % n] for i in range(count)]
            state[0] = index + count
            finish = "length" if state[0] >= max_tokens else None
            if self.token_batch and not finish and index > 0:
                for column, value in zip(rows, (request_id, index, tokens, prompt_len), strict=True):
                    column.append(value)
                continue
            push.send(encode(TokenOutput(request_id, self.worker_id, index, tokens, finish, prompt_len, 0)))
            if finish:
                del self.active[request_id]
        if rows[0]:
            push.send(encode(TokenBatch(self.worker_id, *rows)))

    def _registration(self, command_addr: str) -> WorkerRegister:
        return WorkerRegister(
            worker_id=self.worker_id,
            role="mixed",
            host="127.0.0.1",
            pid=os.getpid(),
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

    def _heartbeat(self) -> WorkerHeartbeat:
        running = len(self.active)
        return WorkerHeartbeat(self.worker_id, 1 << 20, 1 << 20, 0, running, 0, time.time())
