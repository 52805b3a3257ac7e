"""ipc transport (same host, CUDA): the receiver copies the sender's blocks GPU-to-GPU itself.

The sender exports its whole cache once through CUDA IPC (torch's own `reduce_tensor`, the mechanism
torch.multiprocessing uses) and puts the handle in its endpoint; each receiver opens it once per sender
and keeps the mapping. Per request only control messages cross ZMQ: fetch -> the sender checks the
publication, waits for the engine's writes to those blocks and stretches the lease over the receiver's
deadline -> `ready` -> the receiver gathers src blocks from the mapped cache and scatters them into its
own on its copy stream, synchronizes, and acks. Nothing is read after the deadline has passed.

Caveat: `cancel()` cannot wait for a copy running in another process; it is meant for aborted requests,
whose decode side is aborted too, so a copy racing with block reuse there is never used.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

from .base import Endpoint
from .config import KVTransferConfig
from .device import wait_event
from .jobs import Job
from .layout import CacheLayout, dtype_from_name, gather, scatter
from .receiver import ZmqReceiver
from .sender import Publication, ZmqSender
from .wire import READY, FetchRequest, Header, ProtocolError, encode

_HANDLE_KEYS = (
    "size",
    "stride",
    "offset",
    "dtype",
    "device",
    "handle",
    "storage_bytes",
    "storage_offset",
    "ref_counter_handle",
    "ref_counter_offset",
    "event_handle",
    "event_sync",
)


def export_cache(kv_cache: torch.Tensor) -> dict[str, Any]:
    """A msgpack-able CUDA IPC handle of the whole cache (bytes stay bytes)."""
    # reduce_tensor's args: (cls, size, stride, offset, storage_cls, dtype, device, handle, storage_bytes,
    # storage_offset, requires_grad, ref_counter_handle, ref_counter_offset, event_handle, event_sync).
    _, args = reduce_tensor(kv_cache)
    dtype = str(args[5]).removeprefix("torch.")
    picked = (list(args[1]), list(args[2]), args[3], dtype, *args[6:10], *args[11:15])
    return dict(zip(_HANDLE_KEYS, picked, strict=True))


def open_cache(handle: dict[str, Any], device: torch.device) -> torch.Tensor:
    """Map a sender's exported cache into this process. The storage is opened under this process's own
    device: for the same GPU that is a plain mapping, for another GPU of the host CUDA maps it peer to
    peer (device indices differ between processes anyway, e.g. under CUDA_VISIBLE_DEVICES)."""
    h = handle
    dtype = dtype_from_name(h["dtype"])
    return rebuild_cuda_tensor(
        torch.Tensor,
        torch.Size(h["size"]),
        tuple(h["stride"]),
        h["offset"],
        torch.storage.TypedStorage,
        dtype,
        device.index if device.index is not None else torch.cuda.current_device(),
        h["handle"],
        h["storage_bytes"],
        h["storage_offset"],
        False,
        h["ref_counter_handle"],
        h["ref_counter_offset"],
        h["event_handle"],
        h["event_sync"],
    )


def _require_cuda(kv_cache: object) -> None:
    if not isinstance(kv_cache, torch.Tensor) or kv_cache.device.type != "cuda":
        raise ValueError("kv_cache must be a CUDA tensor for the ipc transport")


class IpcSender(ZmqSender):
    transport = "ipc"

    def __init__(self, kv_cache: torch.Tensor, config: KVTransferConfig | None = None) -> None:
        _require_cuda(kv_cache)
        super().__init__(kv_cache, config)

    def _start_transport(self) -> Endpoint:
        return {"handle": export_cache(self._kv), "num_blocks": self._kv.shape[2]}

    def _serve(self, ident: bytes, req: FetchRequest, pub: Publication) -> None:
        wait_event(pub.ready)  # the receiver reads straight from our cache: the engine's writes must be done
        self._reply(ident, [encode(READY, req.request_id, req.xid)])


class IpcReceiver(ZmqReceiver):
    transport = "ipc"

    def __init__(self, kv_cache: torch.Tensor, config: KVTransferConfig | None = None) -> None:
        _require_cuda(kv_cache)
        super().__init__(kv_cache, config)

    def _start_transport(self) -> None:
        self._mapped: dict[bytes, torch.Tensor] = {}  # a sender's IPC handle -> its mapped cache

    def _validate_endpoint(self, endpoint: Endpoint) -> str | None:
        handle = endpoint.get("handle")
        if not isinstance(handle, dict) or any(k not in handle for k in _HANDLE_KEYS):
            return "ipc sender_endpoint needs a 'handle' map with the exported cache"
        return None

    def _on_reply(self, job: Job, header: Header, frames: list) -> None:
        if header.kind != READY:
            raise ProtocolError(f"unexpected {header.kind!r} message")
        src = self._source(job)
        if max(job.src) >= src.shape[2]:
            raise ProtocolError(f"src block id {max(job.src)} is beyond the sender's {src.shape[2]} blocks")
        wait_event(job.ready)
        with self._stream.use():
            device = self._kv.device
            blocks = gather(src, torch.tensor(job.src, device=device))
            scatter(self._kv, torch.tensor(job.dst, device=device), blocks)
        self._stream.synchronize()
        if time.monotonic() > job.deadline:  # past it the sender may have reused its blocks mid-copy
            self._fail(job, f"timed out after {job.timeout_s:g} s (copy finished too late to trust)")
            return
        job.progress = len(job.dst)
        job.num_bytes = len(job.dst) * self._layout.block_bytes
        self._complete(job)

    def _source(self, job: Job) -> torch.Tensor:
        key = job.endpoint["handle"]["handle"]
        src = self._mapped.get(key)
        if src is None:
            try:
                src = open_cache(job.endpoint["handle"], self._kv.device)
            except Exception as e:
                raise ProtocolError(f"cannot open the sender's CUDA IPC handle: {e}") from None
            if src.dim() != 6 or CacheLayout.of(src).mismatch(self._layout):
                raise ProtocolError(f"the sender's shared cache has shape {list(src.shape)}, {src.dtype}")
            self._mapped[key] = src
        return src

    def _on_job_failed(self, job: Job) -> None:
        # Unless the sender itself answered, it may be gone: drop the mapping rather than pin its memory.
        if not job.state.get("sender_error"):
            self._mapped.pop(job.endpoint["handle"]["handle"], None)

    def _shutdown_transport(self) -> None:
        self._mapped.clear()
