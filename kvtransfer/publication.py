"""What a sender keeps per published request, and the named results its reads return."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .verify import binding_fields


class FetchRejected(Exception):
    """A fetch this sender will not serve; the message (and `fields`) go back to the receiver."""

    def __init__(self, message: str, **fields: object) -> None:
        super().__init__(message)
        self.fields = fields


@dataclass(eq=False)
class ReadBlocks:
    blocks: torch.Tensor  # [2 * num_layers, n, block_elems]
    sums: bytes | None  # their checksums (verify.pack_sums), if asked for


@dataclass(eq=False)
class Publication:
    block_ids: list[int]
    block_set: frozenset[int]
    lease_s: float
    deadline: float
    ready: torch.cuda.Event | None  # the engine's writes to these blocks, on CUDA
    nonce: int  # binds the transfer to this publication (kvtransfer/verify.py)
    hashes: dict[int, int]  # block id -> the prompt chain's hash of its content (full blocks only)
    xid: int | None = None  # the fetch attempt being served; acks for other attempts are stale

    def binding(self, epoch: int, block_ids: list[int]) -> dict:
        """What a reply serving `block_ids` says about its binding (verify.check_binding reads it)."""
        return binding_fields(self.nonce, epoch, [self.hashes.get(b) for b in block_ids])
