"""tcp transport: blocks travel as raw ZMQ frames through host memory (works anywhere, CPU included).

The sender answers a `KVFetch` with a stream of `KVData` messages, each a header plus one raw frame
holding `count` consecutive published blocks as [2 * num_layers, count, block_elems] (zero-copy: ZMQ
sends straight from the gathered host buffer). Chunks of at most `chunk_bytes` keep every buffer on
malloc's fast path and let the receiver scatter chunk k while chunk k+1 is still on the wire. The
receiver checks each chunk's position and size, scatters it, and after the last one acks.

Verification (`verify.py`): a chunk's checksums travel in a small `KVSums` message right behind its data
frame: the sender computes them over the host buffer after handing the frame to ZMQ, so the work
overlaps the frame's trip instead of delaying it. The first data header carries the binding (nonce,
epoch, the hash of each block served) and every one says whether sums follow. The receiver checks the
binding on the first chunk, computes its own checksums of each chunk as it arrived and holds the chunk
until the sender's match: only then is it scattered, so corrupt bytes never reach the cache.
"""

from __future__ import annotations

import torch
import zmq

from common.wire.codec import Message, encode
from common.wire.kv_messages import KVData, KVFetch, KVSums
from common.wire.wire_fields import MessageError

from .device import host_buffer, wait_event
from .jobs import Job
from .layout import scatter
from .publication import FetchRejected, Publication
from .receiver import ZmqReceiver
from .sender import ZmqSender
from .verify import VerificationFailed, block_checksums, check_checksums


class TcpSender(ZmqSender):
    transport = "tcp"

    def _serve(self, ident: bytes, req: KVFetch, pub: Publication) -> None:
        rid, xid, ids = req.request_id, req.xid, pub.block_ids
        per_chunk = max(1, self._config.chunk_bytes // self._layout.block_bytes)
        verify = self._config.verify
        for first in range(0, len(ids), per_chunk):
            read = self._read_blocks(rid, pub, ids[first : first + per_chunk], to_host=True)
            if read is None:
                raise FetchRejected(f"request {rid!r} was cancelled at the sender")
            blocks = read.blocks
            binding = pub.binding(self._epoch) if first == 0 else None
            header = encode(KVData(rid, xid, first, blocks.shape[1], verify, binding))
            # The frame keeps a reference to `blocks` until ZMQ has sent it, so no copy is needed.
            payload = blocks.view(-1).view(torch.uint8).numpy()
            sent = self._reply(ident, [header, payload], copy=False)
            if sent and verify:  # read while ZMQ's I/O thread sends the same (unchanged) bytes
                sums = block_checksums(blocks).tolist()  # host memory: the torch form
                sent = self._reply(ident, [encode(KVSums(rid, xid, first, sums))])
            if not sent:
                self._leases.fail(req.request_id, "receiver disconnected during the transfer")
                return


class TcpReceiver(ZmqReceiver):
    transport = "tcp"

    def _on_reply(self, job: Job, msg: Message, frames: list[zmq.Frame]) -> None:
        if isinstance(msg, KVSums):
            self._on_sums(job, msg)
            return
        if not isinstance(msg, KVData) or "held" in job.state:
            raise MessageError(f"unexpected {msg.TYPE!r} message")
        first, count = msg.first, msg.count
        if first != job.progress or first + count > len(job.dst):
            raise MessageError(f"chunk at {first} (+{count}) after {job.progress} of {len(job.dst)} blocks")
        nbytes = count * self._layout.block_bytes
        if len(frames) != 1 or len(frames[0]) != nbytes:
            raise MessageError(f"a chunk of {count} blocks needs one frame of {nbytes} bytes")
        blocks = self._frame_blocks(frames[0], count)
        job.num_bytes += nbytes
        if not self._config.verify:
            self._accept(job, first, blocks)
            return
        if first == 0:
            self._check_binding(job, msg.binding)
        if not msg.sums:
            raise VerificationFailed(f"the sender sends no checksums for blocks {first}..{first + count - 1}")
        job.state["held"] = (first, blocks, frames[0], block_checksums(blocks))  # the frame keeps the bytes

    def _on_sums(self, job: Job, msg: KVSums) -> None:
        held = job.state.pop("held", None)
        if held is None:
            if self._config.verify:
                raise MessageError("checksums without a chunk")
            return  # a sender that verifies talking to a receiver that does not
        first, blocks, _frame, own = held
        if msg.first != first:
            raise MessageError(f"checksums for the chunk at {msg.first}, not {first}")
        check_checksums(msg.sums, own, first)
        self._accept(job, first, blocks)

    def _accept(self, job: Job, first: int, blocks: torch.Tensor) -> None:
        """Scatter a chunk that passed its checks; ack after the last one."""
        if first == 0:
            wait_event(job.ready)
        count = blocks.shape[1]
        self._write(job, first, count, blocks)
        job.progress += count
        if job.progress == len(job.dst):
            self._stream.synchronize()
            self._complete(job)

    def _frame_blocks(self, frame: zmq.Frame, count: int) -> torch.Tensor:
        """The frame's bytes as [2 * num_layers, count, block_elems] blocks (no copy)."""
        raw = torch.frombuffer(frame.buffer, dtype=torch.uint8)
        return raw.view(self._layout.torch_dtype).view(2 * self._layout.num_layers, count, -1)

    def _write(self, job: Job, first: int, count: int, blocks: torch.Tensor) -> None:
        with self._stream.use():  # everything on the copy stream, the index upload included
            if "index" not in job.state:
                job.state["index"] = torch.tensor(job.dst, device=self._kv.device)
            if self._kv.is_cuda:
                # Pinned staging makes the host-to-device copy asynchronous; torch keeps the pinned block
                # alive until the copy stream is done with it.
                staged = host_buffer(blocks.shape, blocks.dtype, pinned=True).copy_(blocks)
                blocks = staged.to(self._kv.device, non_blocking=True)
            scatter(self._kv, job.state["index"][first : first + count], blocks)
