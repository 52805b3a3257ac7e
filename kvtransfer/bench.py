"""Transfer throughput between two processes, against the raw device-to-device copy rate.

    python -m kvtransfer.bench --transport ipc --src-device cuda:0 --dst-device cuda:1 --tokens 1024 6144
    python -m kvtransfer.bench --transport tcp --tokens 1024 6144          (CPU)

A spawned process publishes blocks from its cache; this process fetches them into its own cache and
times fetch() -> DONE from the decode engine's point of view (control messages included), for one prompt of
each `--tokens` length and for `--batch` such prompts handed over together (what one prefill step hands
one decode worker under load). The cache layout defaults to SmolLM2-135M's (30 layers, 3 KV heads of 64,
blocks of 16 tokens, bf16). The raw rate is one large `copy_` from the source device to the destination
device in this process, measured in the same run. Prints one JSON line per case and a table last. The
pipe to the sender process is benchmark plumbing only.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import time

import torch

from common.blocks import blocks_for

from . import KVTransferConfig, TransferStatus, create_receiver, create_sender
from .layout import CacheLayout


def _make_cache(args: argparse.Namespace, num_blocks: int, device: str) -> torch.Tensor:
    shape = (2, args.layers, num_blocks, args.block_size, args.heads, args.head_dim)
    cache = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    return cache.to(getattr(torch, args.dtype)).to(device)


def _sender(conn, args: argparse.Namespace, num_blocks: int) -> None:
    config = KVTransferConfig(transport=args.transport, chunk_bytes=args.chunk_mb << 20)
    sender = create_sender(args.transport, _make_cache(args, num_blocks, args.src_device), config)
    sender.start()
    conn.send(True)
    while True:
        cmd = conn.recv()
        if cmd is None:
            break
        conn.send([sender.publish(rid, ids, 60.0) for rid, ids in cmd])
        sender.poll_released()
    sender.close()


def _parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--transport", default="tcp", choices=["tcp", "ipc", "nccl"])
    p.add_argument("--tokens", type=int, nargs="+", default=[1024, 6144], help="prompt lengths")
    p.add_argument("--batch", type=int, default=16, help="prompts handed over together")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--src-device", default="cpu")
    p.add_argument("--dst-device", default="cpu")
    p.add_argument("--chunk-mb", type=int, default=16)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json-out", default=None)
    return p.parse_args()


def main() -> None:
    args = _parse_args()
    blocks_per = [blocks_for(t, args.block_size) for t in args.tokens]
    num_blocks = 2 * max(blocks_per) * args.batch  # src and dst ids interleave: a real gather
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=_sender, args=(child, args, num_blocks), daemon=True)
    proc.start()
    conn.recv()
    cache = torch.zeros_like(_make_cache(args, num_blocks, args.dst_device))
    receiver = create_receiver(args.transport, cache)
    receiver.start()
    block_bytes = CacheLayout.of(cache).block_bytes
    rows = [{"case": "raw copy", "GBps": raw_copy_GBps(args)}]
    runs = iter(range(10**9))
    for tokens, n in zip(args.tokens, blocks_per, strict=True):
        for batch in sorted({1, args.batch}):
            rates = [
                _timed(conn, receiver, next(runs), n, batch, block_bytes) for _ in range(args.repeat + 1)
            ]
            case = f"{args.transport} {tokens} tok x{batch}"
            rows.append({"case": case, "GBps": statistics.median(rates[1:])})
            print(json.dumps(rows[-1]), flush=True)
    receiver.close()
    conn.send(None)
    proc.join(10)
    _report(rows, args)


def _timed(conn, receiver, run: int, n: int, batch: int, block_bytes: int) -> float:
    """Publish `batch` requests of n blocks each, fetch them all; GB/s over the whole hand-over."""
    reqs = [(f"bench-{run}-{k}", list(range(2 * k * n, 2 * (k + 1) * n, 2))) for k in range(batch)]
    conn.send(reqs)
    endpoints = conn.recv()
    t0 = time.perf_counter()  # from here on only the transfer: the pipe above is benchmark plumbing
    for (rid, src), endpoint in zip(reqs, endpoints, strict=True):
        receiver.fetch(rid, endpoint, src, [b + 1 for b in src], timeout_s=60.0)
    receiver.flush()
    pending = {rid for rid, _ in reqs}
    while pending:
        for result in receiver.poll():
            if result.status is not TransferStatus.DONE:
                raise RuntimeError(f"{result.request_id}: {result.error}")
            pending.discard(result.request_id)
        time.sleep(0.0001)
    return batch * n * block_bytes / (time.perf_counter() - t0) / 1e9


def raw_copy_GBps(args: argparse.Namespace, mib: int = 1024) -> float:
    """One large copy from the source device to the destination device (bytes moved / time)."""
    src = torch.empty(mib << 20, dtype=torch.uint8, device=args.src_device)
    dst = torch.empty_like(src, device=args.dst_device)
    rates = []
    for _ in range(4):
        _sync()
        t0 = time.perf_counter()
        dst.copy_(src)
        _sync()
        rates.append(src.numel() / (time.perf_counter() - t0) / 1e9)
    return statistics.median(rates[1:])


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _report(rows: list[dict], args: argparse.Namespace) -> None:
    raw = rows[0]["GBps"]
    print(f"{'case':<28} {'GB/s':>8} {'of raw':>7}   ({args.src_device} -> {args.dst_device})")
    for row in rows:
        print(f"{row['case']:<28} {row['GBps']:>8.1f} {row['GBps'] / raw:>7.0%}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
