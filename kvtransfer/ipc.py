"""ipc transport (same host, CUDA): the receiver copies the sender's blocks GPU-to-GPU itself, in batches,
without a per-request round trip.

The sender exports its whole cache once through CUDA IPC (torch's own `reduce_tensor`, the mechanism
torch.multiprocessing uses) and puts the handle in every hand-off's `IpcExport`; each receiver opens it
once per sender and keeps the mapping. `publish()` waits until the engine's writes to the blocks are
done (they are by then: the prefill engine has already read the sampled first token back) and returns
a hand-off that binds the read to this publication: the published block ids (the one transport whose
receiver must know them: it reads them itself), the sender's pid and the lease's end (Unix time).

The receiver needs nothing more from the sender. `fetch()` only queues; `flush()` (and `poll()`)
issues ONE block copy (a single-pass kernel, `block_copy.py`) per sender for every queued fetch, on the
receiver's copy stream behind the engine's pending work on the destination blocks, and records an
event; `poll()` reports the batch DONE once the event has fired and posts one `KVCopied` message per
sender (which releases the publications there). So a hand-off costs the engine thread one kernel launch per
batch, and neither engine ever waits on the other. A copy that would start or end past the lease
(minus a margin), or whose sender process is gone, fails instead: the sender may have reused the
blocks, so the decode worker recomputes.

Verification (`verify.py`): the hand-off's `IpcExport` also lists the published blocks' prompt-chain
hashes and their checksums, taken on the sender's GPU when it publishes (one read-only pass
of the block kernel; the engine's writes are done by then). The receiver's copy is the checking one:
the kernel adds the sums of what it copied to the negated sent sums, on the device, and one small
asynchronous read-back of those residuals rides with the batch's event, so a verified batch issues the
same one launch and waits for nothing more than an unverified one. The chain check (the hashes of the
blocks copied against the prompt's chain) runs on the host while the copy runs; a job that fails it is
reported when its batch settles, since the copy writes its dst blocks until then. A block the sender
reused after publishing fails the checksum. The nonce and epoch travel in the hand-off too, but with no
reply from the sender there is nothing to compare them with: the pid and lease checks play the epoch's
part here.

`cancel()` cannot stop a copy running in another process; it is meant for aborted requests, whose decode
side is aborted too, so a copy racing with block reuse there is never used.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from common.net.process import process_alive
from common.wire.blocks import check_block_ids
from common.wire.codec import Message, encode
from common.wire.handoff import HandOff, IpcExport
from common.wire.kv_messages import KVBinding, KVCopied, KVError
from common.wire.wire_fields import MessageError

from .base import TransferResult, TransferStatus
from .block_copy import copy_blocks
from .config import KVTransferConfig
from .cuda_ipc import HANDLE_KEYS, MappedCaches, require_cuda_cache
from .device import host_buffer
from .jobs import Job
from .layout import CacheLayout
from .receiver import ZmqReceiver
from .verify import VerificationFailed, check_residuals, unpack_sums

log = logging.getLogger(__name__)

# A copy must end this long before the sender's lease does: covers the time between our clock read and
# the copy's last write, and the sender's I/O thread noticing the expiry late is on the safe side.
LEASE_MARGIN_S = 1.0
# How often the receiver looks for senders that died (their mappings pin their caches' memory).
DEAD_SENDER_SWEEP_S = 1.0


@dataclass(eq=False)
class CopyBatch:
    """Fetches from one sender copied by one launch; done when `event` has fired."""

    address: str
    jobs: list[Job]
    event: torch.cuda.Event
    expires_at: float  # the earliest lease end among the jobs (Unix time)
    pid: int
    sent: torch.Tensor | None = None  # the sender's checksums of the jobs' blocks, in order (CPU)
    residuals: torch.Tensor | None = None  # pinned: received minus sent sums, readable once `event` fired


class IpcReceiver(ZmqReceiver):
    transport = "ipc"

    def __init__(self, kv_cache: torch.Tensor, config: KVTransferConfig | None = None) -> None:
        require_cuda_cache(kv_cache)
        super().__init__(kv_cache, config)
        self._queued: list[Job] = []  # engine thread only, like everything below
        self._copying: list[CopyBatch] = []
        self._mapped = MappedCaches()
        self._next_sweep = 0.0

    # ---- engine thread ----------------------------------------------------------------------------

    def _next_xid(self) -> int:
        return 0  # nothing is ever fetched, so there are no attempts to tell apart

    def _reject(self, job: Job, error: str) -> None:
        self._fail_direct(job, error)

    def _enqueue(self, job: Job) -> None:
        self._queued.append(job)  # copied at the next flush(), with everything else queued by then
        self._book.set(job.request_id, TransferStatus.TRANSFERRING)

    def flush(self) -> None:
        queued, self._queued = self._queued, []
        by_sender: dict[bytes, list[Job]] = {}
        for job in queued:
            by_sender.setdefault(_ipc(job).cache["handle"], []).append(job)
        for jobs in by_sender.values():
            self._copy(jobs)

    def poll(self) -> list[TransferResult]:
        self.flush()
        still = []
        for batch in self._copying:
            if batch.event.query():
                self._settle(batch)
            else:
                still.append(batch)
        self._copying = still
        self._sweep_dead_senders()
        return self._book.drain()

    def _sweep_dead_senders(self) -> None:
        now = time.monotonic()
        if now < self._next_sweep or not len(self._mapped):
            return
        self._next_sweep = now + DEAD_SENDER_SWEEP_S
        gone = self._mapped.forget_dead(busy={b.pid for b in self._copying})
        if gone:
            log.info("closed the cache mappings of senders that exited: pids %s", gone)

    def _validate_handoff(self, handoff: HandOff) -> str | None:
        cache = handoff.ipc.cache if handoff.ipc is not None else {}  # HandOff sets it exactly for ipc
        if any(k not in cache for k in HANDLE_KEYS) or type(cache["handle"]) is not bytes:
            return "the ipc hand-off's cache is not a CUDA IPC export of a cache"
        return None

    def _copy(self, jobs: list[Job]) -> None:
        """One batched block copy for `jobs` (all from one sender) on the copy stream; when verifying,
        the same kernel sums what it copied against the sender's sums, and the chain is checked on the
        host while it runs."""
        now = time.time()
        live = [j for j in jobs if self._still_valid(j, now)]
        src = self._source_of(live)
        if src is None:
            return
        verify = self._config.verify
        live = [j for j in live if self._ids_fit(j, src.shape[2]) and (not verify or self._take_sums(j))]
        if not live:
            return
        sent = torch.cat([j.state.pop("sent") for j in live]) if verify else None
        plan = self._plan(live, sent)
        with self._stream.use():
            for job in live:
                self._stream.wait(job.ready)  # the engine's earlier work on these dst blocks
            ids = plan.to(self._kv.device, non_blocking=True)
            sums = ids[2] if sent is not None else None  # starts at -sent: ends at 0 where bytes match
            copy_blocks(src, self._kv, ids[0], ids[1], sums)
            residuals = None
            if sums is not None:  # read once the event has fired: no wait
                residuals = host_buffer(sums.shape, sums.dtype, pinned=True).copy_(sums, non_blocking=True)
            event = torch.cuda.Event()
            event.record()  # on the current stream, which use() made the copy stream
        if verify:
            for job in live:
                self._bind(job)
        expires = min(_ipc(j).expires_at for j in live)
        pid = _ipc(live[0]).pid
        self._copying.append(CopyBatch(live[0].address, live, event, expires, pid, sent, residuals))

    def _source_of(self, live: list[Job]) -> torch.Tensor | None:
        """The sender's mapped cache (all of `live` come from one sender), or None, the jobs failed."""
        if not live:
            return None
        try:
            return self._source(live[0])
        except MessageError as e:
            for job in live:
                self._fail_direct(job, str(e))
            return None

    @staticmethod
    def _plan(live: list[Job], sent: torch.Tensor | None) -> torch.Tensor:
        """The copy's src ids, dst ids and (verifying) negated sent sums as one pinned [2 or 3, n] tensor:
        one asynchronous upload, where pageable memory would wait for the copy stream to drain."""
        rows = torch.tensor([[b for j in live for b in _ipc(j).block_ids], [b for j in live for b in j.dst]])
        if sent is not None:
            rows = torch.cat([rows, sent.neg().unsqueeze(0)])
        return rows.pin_memory()

    def _take_sums(self, job: Job) -> bool:
        """Put the sender's checksums of the blocks to copy in job.state["sent"] (False: it has none,
        the job failed)."""
        ipc = _ipc(job)
        try:
            job.state["sent"] = unpack_sums(ipc.sums, len(ipc.block_ids))
        except VerificationFailed as e:
            self._fail_direct(job, f"verification failed: {e}")
            return False
        return True

    def _bind(self, job: Job) -> None:
        """Check that the copied blocks are the prompt's (their hashes at publish time vs its chain). A
        failure is reported when the copy settles, not now: the copy still writes the job's dst blocks."""
        handoff = job.handoff
        try:
            self._check_binding(job, KVBinding(handoff.nonce, handoff.epoch, _ipc(job).hashes))
        except VerificationFailed as e:
            job.state["unbound"] = f"verification failed: {e}"

    def _still_valid(self, job: Job, now: float) -> bool:
        ipc = _ipc(job)
        if ipc.expires_at - LEASE_MARGIN_S <= now:
            self._fail_direct(job, "the sender's lease ran out before the copy could start")
        elif not process_alive(ipc.pid):
            self._fail_direct(job, f"sender process {ipc.pid} is gone", notify=False)
        else:
            return True
        return False

    def _ids_fit(self, job: Job, num_src_blocks: int) -> bool:
        try:
            check_block_ids("ipc.block_ids", _ipc(job).block_ids, num_src_blocks)
        except ValueError as e:
            self._fail_direct(job, f"{e} (the sender has {num_src_blocks} blocks)")
            return False
        return True

    def _settle(self, batch: CopyBatch) -> None:
        if time.time() > batch.expires_at - LEASE_MARGIN_S or not process_alive(batch.pid):
            for job in batch.jobs:  # the sender may have reused its blocks mid-copy
                self._fail_direct(job, "copy finished after the sender's lease ended: not trusted")
            return
        rids, end = [], 0
        dirty = batch.residuals is not None and bool(batch.residuals.any())  # one look when all is well
        for job in batch.jobs:
            first, end = end, end + len(job.dst)
            error = job.state.get("unbound") or (self._mismatch(batch, first, end) if dirty else None)
            if error:
                self._fail_direct(job, error)
                continue
            job.progress = len(job.dst)
            job.num_bytes = len(job.dst) * self._layout.block_bytes
            self._book.finish(job, TransferStatus.DONE, None)
            rids.append(job.request_id)
        self._dealers.post(batch.address, [encode(KVCopied(rids))])

    @staticmethod
    def _mismatch(batch: CopyBatch, first: int, end: int) -> str | None:
        """Why blocks first..end-1 of a settled batch differ from what was sent, or None."""
        if batch.residuals is None or batch.sent is None:
            return None
        try:
            check_residuals(batch.residuals[first:end], batch.sent[first:end])
        except VerificationFailed as e:
            return f"verification failed: {e}"
        return None

    def _fail_direct(self, job: Job, error: str, notify: bool = True) -> None:
        if notify:  # the sender releases now
            self._dealers.post(job.address, [encode(KVError(job.request_id, 0, error))])
        self._book.finish(job, TransferStatus.FAILED, error)

    def _source(self, job: Job) -> torch.Tensor:
        ipc = _ipc(job)
        try:
            src, fresh = self._mapped.get(ipc.cache, ipc.pid, self._kv.device)
        except Exception as e:
            raise MessageError(f"cannot open the sender's CUDA IPC handle: {e}") from None
        if fresh:
            error = (
                f"the sender's shared cache has shape {list(src.shape)}"
                if src.dim() != 6
                else self._layout.mismatch(CacheLayout.of(src))
            )
            if error:
                self._mapped.forget(ipc.cache)
                raise MessageError(error)
        return src

    # ---- I/O thread -------------------------------------------------------------------------------

    def _on_reply(self, job: Job, msg: Message, frames: list) -> None:
        raise MessageError(f"unexpected {msg.TYPE!r} message: ipc fetches are never sent")

    def _shutdown_transport(self) -> None:
        self._mapped.clear()

    def close(self) -> None:
        super().close()
        for job in self._queued + [j for b in self._copying for j in b.jobs]:
            self._book.finish(job, TransferStatus.FAILED, "receiver closed")
        self._queued, self._copying = [], []


def _ipc(job: Job) -> IpcExport:
    """The ipc part of a job's hand-off (`_validate_handoff` let only ipc hand-offs in)."""
    assert job.handoff.ipc is not None
    return job.handoff.ipc
