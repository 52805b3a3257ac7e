"""Moving KV-cache blocks from a prefill worker to a decode worker (DESIGN.md section 6).

Cache contract: each worker holds one tensor `kv_cache` of shape
`[2, num_layers, num_blocks, block_size, num_kv_heads, head_dim]` (k at 0, v at 1); block b is
`kv_cache[:, :, b]`. Both ends agree on everything but `num_blocks`; the dtype and block shape are
checked when a fetch arrives and a mismatch fails that request with a message saying which differs.

Protocol (pull after notice), the same for every transport; its messages are `common.wire`'s:

1. Prefill: `sender.publish(request_id, src_block_ids, lease_s, block_hashes)` pins the blocks and
   returns a `HandOff` (common/wire/handoff.py: transport, the sender's control address
   `tcp://host:port`, request id, nonce, epoch, number of blocks, and the transport's own part); the
   prefill worker's control channel sends it to the decode worker inside its `DecodeRequest`.
2. Decode: allocates as many destination blocks and calls `receiver.fetch(handoff, dst_block_ids,
   timeout_s, block_hashes)`, which returns at once. The receiver's I/O thread sends a `KVFetch`
   (common/wire/kv_messages.py: request id, nonce, attempt number, its dtype and block shape, its
   timeout) over a DEALER socket it keeps per sender. The fetch names only the publication: the sender
   serves the blocks it published, in order, so block ids never travel to the decode side and back.
3. The sender's I/O thread checks the publication (request id and nonce) and layout, stretches the
   lease over the receiver's deadline, and moves the bytes the transport's way:
   - tcp:  gathers the blocks (index_select) into host memory (pinned on CUDA) and replies with chunks
           of `KVData` header + one raw zero-copy frame; the receiver scatters each with index_copy_.
   - ipc:  (same host, CUDA) the hand-off's `IpcExport` carries a CUDA IPC handle of the whole cache
           (opened once per sender) and the published block ids; nothing is fetched: the receiver
           copies src -> dst blocks on the GPU itself and tells the sender `KVCopied`.
   - nccl: (across GPUs; gloo on CPU for tests) a two-rank process group per sender/receiver pair,
           rendezvous through a TCPStore the sender serves on an ephemeral port (`NcclStore`); the
           sender gathers the blocks into one buffer and `send`s it after replying `KVReady`; the
           receiver `recv`s and scatters.
4. When the dst blocks hold the data (copy stream synchronized), the receiver sends `KVAck` and `poll()`
   reports DONE; the sender's `poll_released()` then reports DONE and the prefill engine unpins the
   blocks. Any failure (timeout, dead sender, unknown publication or expired lease, layout mismatch,
   malformed frames) is reported as FAILED with an error string on whichever side sees it; the
   receiver tells the sender (`KVError`) so it releases at once instead of at lease expiry. Nothing in
   the engine's thread blocks or raises for such failures; garbage from a peer fails at most the
   request it names.

Verified hand-offs (`verify.py`): the hand-off `publish()` returns carries the sender's `epoch` and the
publication's `nonce`; replies repeat them with the hash the publication recorded for each served block
and a checksum per block of the bytes read; the receiver checks all of it (against the hand-off, the
prompt's chain `block_hashes` it was given, and its own checksums of what arrived) before DONE, and
fails the transfer otherwise. With `KVTransferConfig.curve` every socket runs ZMQ CURVE
(`common/net/curve.py`): only holders of the cluster's keys can fetch.

Adding a transport: a `ZmqSender` / `ZmqReceiver` pair (sender.py, receiver.py: `_serve`,
`_on_reply` and the other hooks), its name in `common/wire/handoff.py`'s `Transport` (and its part of
`HandOff`, if receivers need more than the address), its entry in `registry.py`, and its choice in
`config.resolve_transport`.

Usage:
    from kvtransfer import KVTransferConfig, create_sender, create_receiver, resolve_transport
    transport = resolve_transport(cfg.transport, kv_cache.device.type, same_host=True)
    sender = create_sender(transport, kv_cache, cfg); sender.start()
"""

from common.wire.handoff import TRANSPORTS, HandOff

from .base import KVReceiver, KVSender, Release, TransferResult, TransferStatus
from .config import KVTransferConfig, resolve_transport
from .registry import create_receiver, create_sender

__all__ = [
    "TRANSPORTS",
    "HandOff",
    "KVReceiver",
    "KVSender",
    "KVTransferConfig",
    "Release",
    "TransferResult",
    "TransferStatus",
    "create_receiver",
    "create_sender",
    "resolve_transport",
]
