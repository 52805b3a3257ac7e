"""CUDA IPC plumbing for the ipc transport: export a cache as a msgpack-able handle, map a peer's, keep
the mappings (and drop those of peers that died), and tell whether the exporting process still exists."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

from common.net.process import process_alive

from .layout import dtype_from_name


def require_cuda_cache(kv_cache: object) -> None:
    if not isinstance(kv_cache, torch.Tensor) or kv_cache.device.type != "cuda":
        raise ValueError("kv_cache must be a CUDA tensor for the ipc transport")


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


@dataclass
class _Mapping:
    pid: int
    cache: torch.Tensor


class MappedCaches:
    """The peers' caches mapped into this process, by IPC handle (the one owner of those mappings).

    Invariant: a mapping lives only while its exporting process does. The driver frees an exported
    allocation only once every importer has closed it, so a mapping kept after its peer died pins the
    dead peer's whole cache on its GPU, and a worker restarted there finds no memory for its own
    cache. `forget_dead` closes those mappings (dropping the last reference closes the handle); it
    must skip peers whose copies may still be running on the device (`busy`)."""

    def __init__(
        self,
        opener: Callable[[dict[str, Any], torch.device], torch.Tensor] | None = None,
        alive: Callable[[int], bool] = process_alive,
    ) -> None:
        self._open = opener or open_cache
        self._alive = alive
        self._maps: dict[bytes, _Mapping] = {}

    def __len__(self) -> int:
        return len(self._maps)

    def get(self, handle: dict[str, Any], pid: int, device: torch.device) -> tuple[torch.Tensor, bool]:
        """The peer's mapped cache, and whether it was mapped just now (the caller checks its layout)."""
        found = self._maps.get(handle["handle"])
        if found is not None:
            return found.cache, False
        cache = self._open(handle, device)
        self._maps[handle["handle"]] = _Mapping(pid, cache)
        return cache, True

    def forget(self, handle: dict[str, Any]) -> None:
        self._maps.pop(handle["handle"], None)

    def forget_dead(self, busy: Iterable[int] = ()) -> list[int]:
        """Close the mappings of peers that no longer exist, except those in `busy`; their pids."""
        keep = set(busy)
        dead = [k for k, m in self._maps.items() if m.pid not in keep and not self._alive(m.pid)]
        pids = [self._maps.pop(k).pid for k in dead]
        if pids and torch.cuda.is_available():
            torch.cuda.ipc_collect()  # also releases what torch's own IPC bookkeeping still holds
        return pids

    def clear(self) -> None:
        self._maps.clear()
