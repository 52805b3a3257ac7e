"""The ipc transport's sender: exports its cache once through CUDA IPC and puts in every publication's
endpoint what a receiver needs to copy the blocks itself (see `ipc.py`, which describes the transport,
and its receiver). Nothing is ever fetched from it; receivers only tell it when they are done."""

from __future__ import annotations

import os
import time

import torch

from .base import Endpoint
from .block_copy import checksum_blocks
from .config import KVTransferConfig
from .cuda_ipc import export_cache, require_cuda_cache
from .device import wait_event
from .publication import FetchRejected, Publication
from .sender import ZmqSender
from .verify import pack_sums
from .wire import FetchRequest


class IpcSender(ZmqSender):
    transport = "ipc"

    def __init__(self, kv_cache: torch.Tensor, config: KVTransferConfig | None = None) -> None:
        require_cuda_cache(kv_cache)
        super().__init__(kv_cache, config)

    def _start_transport(self) -> Endpoint:
        return {"handle": export_cache(self._kv), "num_blocks": self._kv.shape[2]}

    def _publication_endpoint(self, request_id: str, pub: Publication) -> Endpoint:
        wait_event(pub.ready)  # receivers read without asking: the engine's writes must be done now
        lease_end = time.time() + (pub.deadline - time.monotonic())
        ids, sums = pub.block_ids, None
        if self._config.verify:
            with self._stream.use():
                sums = pack_sums(checksum_blocks(self._kv, torch.tensor(ids, device=self._kv.device)))
        binding = pub.binding(self._epoch, ids)
        return {
            **super()._publication_endpoint(request_id, pub),
            "rid": request_id,
            "pid": os.getpid(),
            "expires_at": lease_end,
            "blocks": ids,
            "hashes": binding["hashes"],
            "sums": sums,
        }

    def _serve(self, ident: bytes, req: FetchRequest, pub: Publication) -> None:
        raise FetchRejected("ipc publications are read directly by the receiver; nothing to fetch")
