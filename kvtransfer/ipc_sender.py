"""The ipc transport's sender: exports its cache once through CUDA IPC and puts in every publication's
hand-off (`IpcExport`) what a receiver needs to copy the blocks itself (see `ipc.py`, which describes
the transport, and its receiver). Nothing is ever fetched from it; receivers only tell it when they
are done."""

from __future__ import annotations

import os
import time

import torch

from common.wire.handoff import IpcExport
from common.wire.kv_messages import KVFetch

from .block_copy import checksum_blocks
from .config import KVTransferConfig
from .cuda_ipc import export_cache, require_cuda_cache
from .device import wait_event
from .publication import FetchRejected, Publication
from .sender import ZmqSender
from .verify import pack_sums


class IpcSender(ZmqSender):
    transport = "ipc"

    def __init__(self, kv_cache: torch.Tensor, config: KVTransferConfig | None = None) -> None:
        require_cuda_cache(kv_cache)
        super().__init__(kv_cache, config)

    def _start_transport(self) -> None:
        self._export = export_cache(self._kv)

    def _handoff_part(self, pub: Publication) -> IpcExport:
        wait_event(pub.ready)  # receivers read without asking: the engine's writes must be done now
        lease_end = time.time() + (pub.deadline - time.monotonic())
        ids, sums = pub.block_ids, None
        if self._config.verify:
            with self._stream.use():
                sums = pack_sums(checksum_blocks(self._kv, torch.tensor(ids, device=self._kv.device)))
        return IpcExport(os.getpid(), lease_end, self._export, ids, pub.hashes, sums)

    def _serve(self, ident: bytes, req: KVFetch, pub: Publication) -> None:
        raise FetchRejected("ipc publications are read directly by the receiver; nothing to fetch")
