"""What a sender keeps per published request, and the named results its reads return."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from common.wire.kv_messages import KVBinding


class FetchRejected(Exception):
    """A fetch this sender will not serve; the message (and `pair_broken`) go back to the receiver."""

    def __init__(self, message: str, pair_broken: bool = False) -> None:
        super().__init__(message)
        self.pair_broken = pair_broken


@dataclass(eq=False)
class ReadBlocks:
    blocks: torch.Tensor  # [2 * num_layers, n, block_elems]
    sums: bytes | None  # their checksums (verify.pack_sums), if asked for


@dataclass(eq=False)
class Publication:
    block_ids: list[int]  # what every fetch of it is served, in this order
    lease_s: float
    deadline: float
    ready: torch.cuda.Event | None  # the engine's writes to these blocks, on CUDA
    nonce: int  # binds the transfer to this publication (kvtransfer/verify.py)
    hashes: list[int | None]  # the prompt chain's hash of each block's content (None: partly filled)
    xid: int | None = None  # the fetch attempt being served; acks for other attempts are stale

    def binding(self, epoch: int) -> KVBinding:
        """What a reply serving this publication says about its binding (verify.check_binding reads it)."""
        return KVBinding(self.nonce, epoch, self.hashes)
