"""Transfer throughput between two processes: `python -m kvtransfer.bench --transport tcp --mb 64`.

A spawned process publishes blocks from its cache; this process fetches them into its own cache and
times fetch() -> DONE from the engine's point of view (so control round trips are included). Prints one
JSON line per run and a summary. The pipe to the sender process is benchmark plumbing only.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import time

import torch

from . import KVTransferConfig, TransferStatus, create_receiver, create_sender


def _make_cache(args: argparse.Namespace, num_blocks: int, device: str) -> torch.Tensor:
    shape = (2, args.layers, num_blocks, args.block_size, args.heads, args.head_dim)
    cache = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    return cache.to(getattr(torch, args.dtype)).to(device)


def _sender(conn, args: argparse.Namespace, num_blocks: int) -> None:
    config = KVTransferConfig(transport=args.transport, chunk_bytes=args.chunk_mb << 20)
    sender = create_sender(args.transport, _make_cache(args, num_blocks, args.src_device), config)
    sender.start()
    conn.send(sender.endpoint())
    while True:
        cmd = conn.recv()
        if cmd is None:
            break
        sender.publish(*cmd)
        conn.send(True)
        sender.poll_released()
    sender.close()


def _parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--transport", default="tcp", choices=["tcp", "ipc", "nccl"])
    p.add_argument("--mb", type=float, default=64.0, help="bytes per request, in MiB")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--src-device", default="cpu")
    p.add_argument("--dst-device", default="cpu")
    p.add_argument("--chunk-mb", type=int, default=16)
    p.add_argument("--repeat", type=int, default=5)
    return p.parse_args()


def main() -> None:
    args = _parse_args()
    itemsize = getattr(torch, args.dtype).itemsize
    block_bytes = 2 * args.layers * args.block_size * args.heads * args.head_dim * itemsize
    n = max(1, round(args.mb * (1 << 20) / block_bytes))
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=_sender, args=(child, args, 2 * n), daemon=True)
    proc.start()
    endpoint = conn.recv()
    receiver = create_receiver(args.transport, torch.zeros_like(_make_cache(args, 2 * n, args.dst_device)))
    receiver.start()
    rates = [_timed_fetch(conn, receiver, endpoint, i, n) for i in range(args.repeat + 1)][1:]  # 0: warm-up
    summary = {"transport": args.transport, "MiB": round(n * block_bytes / (1 << 20), 1), "blocks": n}
    summary.update(median_GBps=round(statistics.median(rates), 3), best_GBps=round(max(rates), 3))
    print(json.dumps(summary))
    receiver.close()
    conn.send(None)
    proc.join(10)


def _timed_fetch(conn, receiver, endpoint: dict, i: int, n: int) -> float:
    """Publish n blocks (every other one: a real gather, not one slice), fetch them; GB/s."""
    src, dst = list(range(0, 2 * n, 2)), list(range(1, 2 * n, 2))
    conn.send((f"bench-{i}", src, 60.0))
    conn.recv()
    t0 = time.perf_counter()
    receiver.fetch(f"bench-{i}", endpoint, src, dst, timeout_s=60.0)
    result = _wait(receiver)
    seconds = time.perf_counter() - t0
    assert result.status is TransferStatus.DONE, result.error
    print(json.dumps({"run": i, "bytes": result.num_bytes, "seconds": round(seconds, 5)}))
    return result.num_bytes / seconds / 1e9


def _wait(receiver):
    while True:
        results = receiver.poll()
        if results:
            return results[0]
        time.sleep(0.0002)


if __name__ == "__main__":
    main()
