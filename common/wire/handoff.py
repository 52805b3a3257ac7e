"""The hand-off record: the one shape in which a KV publication travels from a prefill worker to the
decode worker that pulls it.

`KVSender.publish()` (kvtransfer) returns a `HandOff`; the prefill worker puts it in its `DecodeRequest`
(or `KVProbe`) and the decode worker hands it, with its own destination block ids, to
`KVReceiver.fetch(handoff, dst_block_ids)`, the same call on every transport. A fetch names only the
publication (`request_id`, `nonce`): the sender serves the blocks it published, so its block ids never
travel to the decode side and back. The one exception is ipc, whose receiver copies the sender's blocks
itself and so must know them: they travel once, in `ipc`.

`nonce` (per publication) and `epoch` (per started sender) are what every reply is checked against
(kvtransfer/verify.py). Torch-free, like the rest of `common.wire`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from common.wire.blocks import check_block_ids
from common.wire.wire_fields import Count, Id, MaybeHashes, MessageError, Positive, check_record

Transport = Literal["tcp", "ipc", "nccl"]
TRANSPORTS: tuple[str, ...] = get_args(Transport)


def _distinct_block_ids(name: str, value: Any) -> None:
    try:
        check_block_ids(name, value)
    except ValueError as e:
        raise MessageError(str(e)) from None


BlockIds = Annotated[list[int], _distinct_block_ids]


@dataclass(frozen=True)
class IpcExport:
    """What an ipc receiver needs to copy a publication itself, without asking the sender."""

    pid: Positive  # the sender's process: a copy from a process that is gone is not trusted
    expires_at: float  # the lease's end (Unix time); a copy must end before it
    cache: dict  # torch's CUDA IPC export of the sender's whole cache (kvtransfer/cuda_ipc.py)
    block_ids: BlockIds  # the published blocks, in the order their KV is read
    hashes: MaybeHashes  # the prompt chain's hash of each block (None: a partly filled one)
    sums: bytes | None  # each block's checksum at publish time (kvtransfer/verify.py), None: unverified

    def __post_init__(self) -> None:
        check_record(self)
        if len(self.hashes) != len(self.block_ids):
            raise MessageError(f"ipc.hashes must have one entry per block ({len(self.block_ids)})")


@dataclass(frozen=True)
class NcclStore:
    """Where an nccl receiver meets the sender to form their two-rank group."""

    host: Id
    port: Positive
    backend: Literal["nccl", "gloo"]

    def __post_init__(self) -> None:
        check_record(self)


@dataclass(frozen=True)
class HandOff:
    """One publication of a request's KV blocks, as its receiver reaches and checks it.

    `address` is the sender's control socket (tcp://host:port); `num_blocks` how many blocks it
    serves, which is how many destination blocks the fetch must bring. Exactly the transport's own
    part (`ipc`, `nccl`) is set."""

    transport: Transport
    address: Id
    request_id: Id  # the publication's name at the sender (a request id, or a probe id)
    nonce: Count
    epoch: Count
    num_blocks: Positive
    ipc: IpcExport | None = None
    nccl: NcclStore | None = None

    def __post_init__(self) -> None:
        check_record(self)
        for part in ("ipc", "nccl"):
            if (self.transport == part) != (getattr(self, part) is not None):
                raise MessageError(f"{part} must be set exactly when transport is {part!r}")
        if self.ipc is not None and len(self.ipc.block_ids) != self.num_blocks:
            raise MessageError(f"ipc.block_ids must hold num_blocks ({self.num_blocks}) ids")
