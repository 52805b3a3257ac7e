"""CUDA IPC plumbing for the ipc transport: export a cache as a msgpack-able handle, map a peer's, and
tell whether the exporting process still exists."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

from .layout import dtype_from_name

HANDLE_KEYS = (
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
    return dict(zip(HANDLE_KEYS, picked, strict=True))


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


def process_alive(pid: int) -> bool:
    """Whether a process of this host with `pid` exists (it may belong to another user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
