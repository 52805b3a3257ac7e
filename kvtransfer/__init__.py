"""Moving KV-cache blocks from a prefill worker to a decode worker (DESIGN.md section 6).

Cache contract: each worker holds one tensor `kv_cache` of shape
`[2, num_layers, num_blocks, block_size, num_kv_heads, head_dim]` (k at 0, v at 1); block b is
`kv_cache[:, :, b]`. Both ends agree on everything but `num_blocks`; the dtype and block shape are
checked when a fetch arrives and a mismatch fails that request with a message saying which differs.

Protocol (pull after notice), the same for every transport:

1. Prefill: `sender.publish(request_id, src_block_ids, lease_s, block_hashes)` pins the blocks, then
   the prefill worker's own control channel sends the decode worker a notice with the endpoint it
   returned (a msgpack-able dict: {"transport", "address" (the sender's ZMQ ROUTER, `tcp://host:port`),
   "epoch", "nonce", ...transport keys}) and the src block ids.
2. Decode: allocates destination blocks and calls `receiver.fetch(request_id, endpoint, src_block_ids,
   dst_block_ids, timeout_s, block_hashes)`, which returns at once. The receiver's I/O thread sends a
   fetch request (msgpack: request id, attempt number, src ids, its dtype and block shape, its timeout)
   over a DEALER socket it keeps per sender.
3. The sender's I/O thread checks the publication and layout, stretches the lease over the receiver's
   deadline, and moves the bytes the transport's way:
   - tcp:  gathers the blocks (index_select) into host memory (pinned on CUDA) and replies with chunks
           of msgpack header + one raw zero-copy frame; the receiver scatters each with index_copy_.
   - ipc:  (same host, CUDA) the endpoint carries a CUDA IPC handle of the whole cache, opened once per
           sender; the sender replies "ready" and the receiver copies src -> dst blocks on the GPU itself.
   - nccl: (across GPUs; gloo on CPU for tests) a two-rank process group per sender/receiver pair,
           rendezvous through a TCPStore the sender serves on an ephemeral port; the sender gathers the
           blocks into one buffer and `send`s it after replying "ready"; the receiver `recv`s and scatters.
4. When the dst blocks hold the data (copy stream synchronized), the receiver acks and `poll()` reports
   DONE; the sender's `poll_released()` then reports DONE and the prefill engine unpins the blocks.
   Any failure (timeout, dead sender, unknown request or expired lease, layout mismatch, malformed
   frames) is reported as FAILED with an error string on whichever side sees it; the receiver tells the
   sender so it releases at once instead of at lease expiry. Nothing in the engine's thread blocks or
   raises for such failures; garbage from a peer fails at most the request it names.

Verified hand-offs (`verify.py`): the endpoint `publish()` returns carries the sender's `epoch` and the
publication's `nonce`; replies repeat them with the hash the publication recorded for each served block
and a checksum per block of the bytes read; the receiver checks all of it (against the endpoint, the
prompt's chain `block_hashes` it was given, and its own checksums of what arrived) before DONE, and
fails the transfer otherwise. With `KVTransferConfig.curve` every socket runs ZMQ CURVE
(`common/net/curve.py`): only holders of the cluster's keys can fetch.

Endpoint dicts (msgpack-able; bytes stay bytes; `publish()` adds "nonce", ipc more, see ipc.py):
    tcp:  {"transport": "tcp",  "address": "tcp://127.0.0.1:41234", "epoch": int}
    ipc:  {"transport": "ipc",  "address": ..., "num_blocks": int,
           "handle": {"size", "stride", "offset", "dtype", "device", "handle": bytes, "storage_bytes",
                      "storage_offset", "ref_counter_handle": bytes, "ref_counter_offset",
                      "event_handle": bytes, "event_sync"}}      (torch's CUDA IPC export of the cache)
    nccl: {"transport": "nccl", "address": ..., "store_host": str, "store_port": int,
           "backend": "nccl" | "gloo"}

Usage:
    from kvtransfer import KVTransferConfig, create_sender, create_receiver, resolve_transport
    transport = resolve_transport(cfg.transport, kv_cache.device.type, same_host=True)
    sender = create_sender(transport, kv_cache, cfg); sender.start()
"""

from .base import Endpoint, KVReceiver, KVSender, Release, TransferResult, TransferStatus
from .config import TRANSPORTS, KVTransferConfig, resolve_transport
from .registry import create_receiver, create_sender

__all__ = [
    "TRANSPORTS",
    "Endpoint",
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
