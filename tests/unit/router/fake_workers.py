"""Scripted prefill/decode/mixed workers speaking the real wire protocol (ZMQ + common.wire.messages).

They "generate" a fixed reply (a list of token ids) so the router can be tested end to end without a
model: registration, heartbeats, PrefillRequest -> first token -> DecodeRequest -> remaining tokens,
GenerateRequest (a decode or mixed worker prefills itself and streams from index 0), cache events
(prefill and mixed workers) and snapshots, Abort, stage timings, and failure injection.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass, field

import zmq
import zmq.asyncio

from common.wire.cache_messages import KVEventBatch, Snapshot, SnapshotRequest
from common.wire.handoff import HandOff
from common.wire.hashing import block_hashes, probe_hash
from common.wire.kv_events import BlockStored
from common.wire.logprobs import TokenLogprob
from common.wire.messages import (
    Abort,
    DecodeRequest,
    GenerateRequest,
    Message,
    PrefillRequest,
    RequestFailed,
    TokenBatch,
    TokenOutput,
    WorkerHeartbeat,
    WorkerRegister,
    decode,
    encode,
)
from common.wire.sampling_params import SamplingParams


@dataclass
class Script:
    """How a fake worker behaves."""

    reply: list[int] = field(default_factory=list)  # tokens to generate; ends with EOS to finish "stop"
    eos_id: int = 2
    first_token_delay: float = 0.0  # prefill: delay index 0 so decode tokens arrive first
    token_delay: float = 0.0  # decode: pause between tokens
    fail_retryable: bool = False  # prefill / generate: answer RequestFailed(retryable=True)
    fail_invalid: str | None = None  # prefill / generate: answer RequestFailed(invalid=True) with this
    silent: bool = False  # prefill / generate: accept the request and never answer
    block_size: int = 16
    probe_hash: int | None = None  # None: the correct probe hash
    heartbeat_interval: float = 0.05
    max_model_len: int = 4096
    num_kv_blocks: int = 1000
    num_running: int = 0  # heartbeat figures
    queued_prefill_tokens: int = 0
    timings: dict[str, float] | None = None  # reported once per request (on the first message sent)


class FakeWorker:
    def __init__(self, worker_id: str, role: str, inbox_addr: str, script: Script) -> None:
        self.worker_id = worker_id
        self.role = role
        self.inbox_addr = inbox_addr
        self.script = script
        self.received: list[Message] = []
        self.hashes: set[int] = set()
        self.seq = 0
        self.heartbeats_on = True
        self._ctx = zmq.asyncio.Context()
        self._tasks: list[asyncio.Task] = []
        self._peers: dict[str, zmq.asyncio.Socket] = {}

    async def start(self) -> None:
        self._push = self._socket(zmq.PUSH)
        self._push.connect(self.inbox_addr)
        self._cmd = self._socket(zmq.PULL)
        self._cmd.bind("tcp://127.0.0.1:*")
        self.command_addr = self._cmd.getsockopt_string(zmq.LAST_ENDPOINT)
        self.events_addr = None
        if self.role in ("prefill", "mixed"):
            self._pub = self._socket(zmq.PUB)
            self._pub.bind("tcp://127.0.0.1:*")
            self.events_addr = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        await self.register()
        self._tasks = [asyncio.create_task(self._heartbeats()), asyncio.create_task(self._commands())]

    def registration(self) -> WorkerRegister:
        s = self.script
        return WorkerRegister(
            worker_id=self.worker_id,
            role=self.role,
            host="localhost",
            pid=os.getpid(),
            command_addr=self.command_addr,
            events_addr=self.events_addr,
            kv_endpoint={"transport": "fake"},
            block_size=s.block_size,
            probe_hash=s.probe_hash if s.probe_hash is not None else probe_hash(s.block_size),
            num_kv_blocks=s.num_kv_blocks,
            max_model_len=s.max_model_len,
            max_num_batched_tokens=2048,
            model_name="fake",
        )

    async def register(self) -> None:
        await self.send(self.registration())

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._ctx.destroy(linger=0)

    def _socket(self, kind: int) -> zmq.asyncio.Socket:
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        return sock

    async def send(self, msg: Message) -> None:
        await self._push.send(encode(msg))

    async def publish(self, events: list[dict]) -> None:
        self.seq += 1
        await self._pub.send(encode(KVEventBatch(self.worker_id, self.seq, events)))

    def of_type(self, cls: type) -> list:
        return [m for m in self.received if isinstance(m, cls)]

    async def _heartbeats(self) -> None:
        while True:
            if self.heartbeats_on:
                s = self.script
                blocks, running, queued = s.num_kv_blocks, s.num_running, s.queued_prefill_tokens
                hb = WorkerHeartbeat(self.worker_id, blocks, blocks, 0, running, queued, 0.0)
                await self.send(hb)
            await asyncio.sleep(self.script.heartbeat_interval)

    async def _commands(self) -> None:
        while True:
            msg = decode(await self._cmd.recv())
            self.received.append(msg)
            if isinstance(msg, PrefillRequest):
                asyncio.create_task(self._prefill(msg))
            elif isinstance(msg, DecodeRequest):
                asyncio.create_task(self._decode(msg))
            elif isinstance(msg, GenerateRequest):
                asyncio.create_task(self._generate(msg))
            elif isinstance(msg, SnapshotRequest):
                await self.send(Snapshot(self.worker_id, self.seq, sorted(self.hashes)))

    async def _prefill(self, req: PrefillRequest) -> None:
        s = self.script
        cached = await self._admit(req)
        if cached is None:
            return
        first = s.reply[0]
        max_tokens = req.sampling.max_tokens
        done = "stop" if first == s.eos_id else ("length" if max_tokens == 1 else None)
        if done is None:
            peer = self._peer(req.decode_command_addr)
            decode_req = DecodeRequest(
                req.request_id,
                req.prompt_token_ids,
                first,
                req.sampling,
                # A fake decode worker never fetches: the record only has to be a valid one.
                HandOff("tcp", "tcp://127.0.0.1:1", req.request_id, nonce=0, epoch=0, num_blocks=1),
                self.worker_id,
                req.deadline,
            )
            await peer.send(encode(decode_req))
        await asyncio.sleep(s.first_token_delay)
        n_prompt = len(req.prompt_token_ids)
        logprobs = [TokenLogprob(-0.25, ((first, -0.25),))] if req.sampling.logprobs is not None else None
        out = TokenOutput(
            req.request_id,
            self.worker_id,
            0,
            [first],
            done,
            n_prompt,
            cached * s.block_size,
            logprobs=logprobs,
            timings=s.timings,
        )
        await self.send(out)

    async def _admit(self, req: PrefillRequest | GenerateRequest) -> int | None:
        """A request that computes its prompt here, as the script says: None when it is dropped
        (silent) or refused (retryable failure), else the leading blocks the cache already held."""
        if self.script.silent:
            return None
        if self.script.fail_retryable:
            await self.send(RequestFailed(req.request_id, self.worker_id, "out of blocks", True))
            return None
        if self.script.fail_invalid is not None:
            await self.send(
                RequestFailed(req.request_id, self.worker_id, self.script.fail_invalid, False, True)
            )
            return None
        return await self._cache_prompt(req.prompt_token_ids)

    async def _cache_prompt(self, prompt: list[int]) -> int:
        """Leading blocks already held; the rest are added (and published by workers with events)."""
        s = self.script
        hashes = block_hashes(prompt, s.block_size)
        cached = next((i for i, h in enumerate(hashes) if h not in self.hashes), len(hashes))
        new = [h for h in hashes if h not in self.hashes]
        if new:
            self.hashes.update(new)
            if self.events_addr is not None:
                await self.publish([BlockStored(tuple(new), hashes[cached - 1] if cached else None)])
        return cached

    async def _generate(self, req: GenerateRequest) -> None:
        """A decode/mixed worker prefilling the prompt itself: every token from index 0, one stream."""
        s = self.script
        cached = await self._admit(req)
        if cached is None:
            return
        await asyncio.sleep(s.first_token_delay)
        await self._stream(req.request_id, req.prompt_token_ids, req.sampling, 0, cached * s.block_size)

    def _peer(self, addr: str) -> zmq.asyncio.Socket:
        if addr not in self._peers:
            self._peers[addr] = self._socket(zmq.PUSH)
            self._peers[addr].connect(addr)
        return self._peers[addr]

    async def _decode(self, req: DecodeRequest) -> None:
        await self._stream(req.request_id, req.prompt_token_ids, req.sampling, 1, 0)

    async def _stream(
        self, request_id: str, prompt: list[int], sampling: SamplingParams, start: int, cached_tokens: int
    ) -> None:
        """Tokens `start`.. of the reply, one message each (plain mid-stream ones as one-row TokenBatches,
        as the real decode worker sends them); a remote decode reports a KV transfer."""
        s = self.script
        max_tokens = sampling.max_tokens
        want_logprobs = sampling.logprobs is not None
        timings = s.timings
        for index in range(start, max_tokens):
            if any(isinstance(m, Abort) and m.request_id == request_id for m in self.received):
                return
            token = s.reply[index % len(s.reply)]
            finish = "stop" if token == s.eos_id else ("length" if index == max_tokens - 1 else None)
            logprobs = [TokenLogprob(-0.5, ((token, -0.5), (7, -1.5)))] if want_logprobs else None
            transfer = index == 1 and start == 1
            if not (finish or logprobs or transfer or timings or index == start):
                # A plain mid-stream token: the real decode worker sends these as TokenBatch rows.
                await self.send(TokenBatch(self.worker_id, [request_id], [index], [[token]], [len(prompt)]))
                await asyncio.sleep(s.token_delay)
                continue
            out = TokenOutput(
                request_id,
                self.worker_id,
                index,
                [token],
                finish,
                len(prompt),
                cached_tokens if index == 0 else 0,
                logprobs=logprobs,
                kv_transfer_bytes=1024 if transfer else 0,
                kv_transfer_seconds=0.001 if transfer else 0.0,
                timings=timings,
            )
            timings = None
            await self.send(out)
            if finish:
                return
            await asyncio.sleep(s.token_delay)


async def start_workers(inbox_addr: str, specs: list[tuple[str, str, Script]]) -> list[FakeWorker]:
    workers = [FakeWorker(worker_id, role, inbox_addr, script) for worker_id, role, script in specs]
    for w in workers:
        await w.start()
    return workers
