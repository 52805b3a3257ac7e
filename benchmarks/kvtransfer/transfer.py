"""Transfer throughput between two processes, against the raw device-to-device copy rate.

    python benchmarks/kvtransfer/transfer.py --transport ipc --src-device cuda:0 --dst-device cuda:1 \
        --tokens 1024 6144
    python benchmarks/kvtransfer/transfer.py --transport tcp --tokens 1024 6144          (CPU)

A spawned process publishes blocks from its cache; this process fetches them into its own cache and
times fetch() -> DONE from the decode engine's point of view (control messages included), for one prompt of
each `--tokens` length and for `--batch` such prompts handed over together (what one prefill step hands
one decode worker under load). The cache layout defaults to SmolLM2-135M's (30 layers, 3 KV heads of 64,
blocks of 16 tokens, bf16). The raw rate is one large `copy_` from the source device to the destination
device in this process, measured in the same run. Prints one JSON line per case and a table last. The
pipe to the sender process is benchmark plumbing only.

    python benchmarks/kvtransfer/transfer.py --transport tcp --verify-overhead

`--verify-overhead` measures what verified hand-offs (kvtransfer/verify.py) cost: every case runs with
verification on and off at both ends (separate sender/receiver pairs, one run of each in turn, which
first alternating, so load drifts hit both alike) and reports the median time per transfer of each and
the overhead: the median of the paired differences (on minus off, run by run) as a percentage of the
median unverified time. Both modes hand the receiver the prompt's block-hash chain, hashed before the
timed region: a decode worker has it from admission whether it verifies or not. It also times the
checksum passes that remain outside any copy, what verification would cost if nothing overlapped them:
tcp's `block_checksums` of each host chunk at both ends; ipc's sender pass at publish time
(`block_copy.checksum_blocks`, on the prefill side, outside the timed transfer; the receiver's check is
part of its copy kernel); none for nccl (the gather and the scatter take the sums as they move bytes).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from common.wire.blocks import blocks_for  # noqa: E402
from common.wire.handoff import TRANSPORTS  # noqa: E402
from common.wire.hashing import block_hashes  # noqa: E402
from kvtransfer import KVTransferConfig, TransferStatus, create_receiver, create_sender  # noqa: E402
from kvtransfer.block_copy import checksum_blocks  # noqa: E402
from kvtransfer.layout import CacheLayout, flat_view  # noqa: E402
from kvtransfer.verify import block_checksums  # noqa: E402


def _make_cache(args: argparse.Namespace, num_blocks: int, device: str) -> torch.Tensor:
    shape = (2, args.layers, num_blocks, args.block_size, args.heads, args.head_dim)
    cache = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    return cache.to(getattr(torch, args.dtype)).to(device)


def _config(args: argparse.Namespace, verify: bool) -> KVTransferConfig:
    return KVTransferConfig(transport=args.transport, chunk_bytes=args.chunk_mb << 20, verify=verify)


def _modes(args: argparse.Namespace) -> list[bool]:
    """The verify settings to run: both when measuring the overhead, else the default (on)."""
    return [True, False] if args.verify_overhead else [True]


def _sender(conn, args: argparse.Namespace, num_blocks: int) -> None:
    cache = _make_cache(args, num_blocks, args.src_device)
    senders = {v: create_sender(args.transport, cache, _config(args, v)) for v in _modes(args)}
    for sender in senders.values():
        sender.start()
    conn.send(True)
    while True:
        cmd = conn.recv()
        if cmd is None:
            break
        verify, reqs = cmd
        conn.send([senders[verify].publish(rid, ids, 60.0, hashes) for rid, ids, hashes in reqs])
        for sender in senders.values():
            sender.poll_released()
    for sender in senders.values():
        sender.close()


def _parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--transport", default="tcp", choices=TRANSPORTS)
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
    p.add_argument("--verify-overhead", action="store_true", help="time verification on vs off")
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
    receivers = {v: create_receiver(args.transport, cache, _config(args, v)) for v in _modes(args)}
    for receiver in receivers.values():
        receiver.start()
    block_bytes = CacheLayout.of(cache).block_bytes
    rows = [{"case": "raw copy", "GBps": raw_copy_GBps(args)}]
    runs = iter(range(10**9))
    for tokens, n in zip(args.tokens, blocks_per, strict=True):
        for batch in sorted({1, args.batch}):
            seconds: dict[bool, list[float]] = {v: [] for v in receivers}
            for i in range(args.repeat + 1):
                # Interleaved, so drifting load hits both; which goes first alternates.
                for verify in sorted(receivers, reverse=i % 2 == 0):
                    receiver = receivers[verify]
                    seconds[verify].append(_timed(conn, receiver, verify, next(runs), n, batch, args))
            row = _row(args, f"{args.transport} {tokens} tok x{batch}", seconds, batch * n * block_bytes)
            rows.append(row)
            print(json.dumps(row), flush=True)
    for receiver in receivers.values():
        receiver.close()
    conn.send(None)
    proc.join(10)
    _report(rows, args)


def _row(args: argparse.Namespace, case: str, seconds: dict[bool, list[float]], nbytes: int) -> dict:
    verified = statistics.median(seconds[True][1:])  # the first run warms up
    row = {"case": case, "GBps": nbytes / verified / 1e9}
    if False in seconds:
        plain = statistics.median(seconds[False][1:])
        # Paired run by run: a load spike on a shared machine shifts one pair, not the median.
        diffs = [on - off for on, off in zip(seconds[True][1:], seconds[False][1:], strict=True)]
        checksums = sum(checksum_seconds(args, device, nbytes) for device in _checksum_passes(args))
        row.update(
            ms_verified=verified * 1e3,
            ms_unverified=plain * 1e3,
            overhead_pct=100 * statistics.median(diffs) / plain,
            checksum_pct=100 * checksums / plain,
        )
    return row


def _timed(conn, receiver, verify: bool, run: int, n: int, batch: int, args: argparse.Namespace) -> float:
    """Publish `batch` requests of n blocks each, fetch them all; seconds for the whole hand-over."""
    tokens = [[(run * 7 + k * 13 + i) % 30000 for i in range(n * args.block_size)] for k in range(batch)]
    # Both sides have these already (the decode worker hashes the prompt at admission, verified or not).
    chains = [block_hashes(t, args.block_size) for t in tokens]
    srcs = [list(range(2 * k * n, 2 * (k + 1) * n, 2)) for k in range(batch)]
    reqs = [(f"bench-{run}-{k}", srcs[k], chains[k]) for k in range(batch)]
    conn.send((verify, reqs))
    handoffs = conn.recv()
    t0 = time.perf_counter()  # from here on only the transfer: the pipe above is benchmark plumbing
    for (_, src, chain), handoff in zip(reqs, handoffs, strict=True):
        receiver.fetch(handoff, [b + 1 for b in src], 60.0, chain)
    receiver.flush()
    pending = {rid for rid, _, _ in reqs}
    while pending:
        for result in receiver.poll():
            if result.status is not TransferStatus.DONE:
                raise RuntimeError(f"{result.request_id}: {result.error}")
            pending.discard(result.request_id)
        time.sleep(0.0001)
    return time.perf_counter() - t0


def _checksum_passes(args: argparse.Namespace) -> list[str]:
    """The device of each checksum pass a transfer makes outside a copy (see the module's docstring)."""
    return {"tcp": ["cpu", "cpu"], "ipc": [args.src_device], "nccl": []}[args.transport]


def checksum_seconds(args: argparse.Namespace, device: str, nbytes: int) -> float:
    """One checksum pass over a transfer of `nbytes`, as the transport does it: tcp sums each chunk (at
    most `--chunk-mb`) of host memory just after writing or receiving it, so while it is in the cache;
    ipc's sender sums the whole publication with the block kernel. The fastest of a few synchronized runs."""
    chunk = min(nbytes, args.chunk_mb << 20) if args.transport == "tcp" else nbytes
    dtype = getattr(torch, args.dtype)
    n = max(
        1,
        chunk // CacheLayout(args.dtype, args.layers, args.block_size, args.heads, args.head_dim).block_bytes,
    )
    cache = torch.ones(
        2, args.layers, n, args.block_size, args.heads, args.head_dim, dtype=dtype, device=device
    )
    ids = torch.arange(n, device=device)
    run = (
        (lambda: checksum_blocks(cache, ids))
        if cache.is_cuda
        else (lambda: block_checksums(flat_view(cache)))
    )
    times = []
    with torch.cuda.device(cache.device) if cache.is_cuda else contextlib.nullcontext():
        for _ in range(8):
            _sync()
            t0 = time.perf_counter()
            run()
            _sync()
            times.append(time.perf_counter() - t0)
    return min(times[1:]) * -(-nbytes // chunk)


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
    if args.verify_overhead:
        print(f"\n{'verification':<28} {'ms on':>8} {'ms off':>8} {'overhead':>9} {'sum passes':>10}")
        for row in rows[1:]:
            print(
                f"{row['case']:<28} {row['ms_verified']:>8.2f} {row['ms_unverified']:>8.2f} "
                f"{row['overhead_pct']:>8.1f}% {row['checksum_pct']:>9.1f}%"
            )
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
