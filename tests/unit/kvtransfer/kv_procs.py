"""Test helpers: seeded caches, a sender living in a spawned process, and result polling.

The sender process is driven over a multiprocessing pipe (test plumbing only; the transfer itself uses
the real sockets under test)."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import time
from dataclasses import dataclass, replace

import torch

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


@dataclass(frozen=True)
class CacheSpec:
    num_layers: int = 3
    num_blocks: int = 48
    block_size: int = 8
    num_kv_heads: int = 2
    head_dim: int = 32
    dtype: str = "bfloat16"
    seed: int = 1234
    device: str = "cpu"

    def make(self) -> torch.Tensor:
        """The same random cache in every process (seeded CPU generator, then cast and moved). dtype
        "fp8": an engine fp8 cache (scale rows included) whose every slot was stored by `kv_fp8.store`."""
        gen = torch.Generator().manual_seed(self.seed)
        if self.dtype == "fp8":
            return self._make_fp8(gen)
        shape = (2, self.num_layers, self.num_blocks, self.block_size, self.num_kv_heads, self.head_dim)
        return torch.randn(shape, generator=gen).to(DTYPES[self.dtype]).to(self.device)

    def _make_fp8(self, gen: torch.Generator) -> torch.Tensor:
        from common.attention import kv_fp8

        dims = (self.num_layers, self.num_blocks, self.block_size, self.num_kv_heads, self.head_dim)
        cache = torch.zeros(kv_fp8.cache_shape(*dims, kv_fp8.FP8_DTYPE), dtype=kv_fp8.FP8_DTYPE)
        slots = torch.arange(self.num_blocks * self.block_size)
        # Magnitudes that differ by token, so every stored vector has its own scale.
        size = (slots.numel(), self.num_kv_heads, self.head_dim)
        for k, v in kv_fp8.layer_views(cache, self.block_size):
            kv = [
                torch.randn(size, generator=gen) * torch.rand(size[0], 1, 1, generator=gen) * 8 for _ in "kv"
            ]
            kv_fp8.store(*kv, k, v, slots)
        return cache.to(self.device)

    def with_(self, **kw) -> CacheSpec:
        return replace(self, **kw)


SPECS = [CacheSpec(dtype="bfloat16"), CacheSpec(dtype="float32", seed=99)]


def _sender_main(conn, transport: str, specs: list[CacheSpec], config_kw: dict) -> None:
    from kvtransfer import KVTransferConfig, create_sender

    config = KVTransferConfig(transport=transport, **config_kw)
    caches = [spec.make() for spec in specs]
    senders = [create_sender(transport, cache, config) for cache in caches]
    for s in senders:
        s.start()
    conn.send([s.address for s in senders])
    released: dict[str, tuple[str, str | None]] = {}
    try:
        while True:
            for s in senders:
                for r in s.poll_released():
                    released[r.request_id] = (r.status.value, r.error)
            if not conn.poll(0.01):
                continue
            cmd, which, args = conn.recv()
            if cmd == "stop":
                break
            try:
                if cmd == "publish":
                    conn.send(("ok", senders[which].publish(*args)))
                elif cmd == "cancel":
                    conn.send(("ok", senders[which].cancel(*args)))
                elif cmd == "released":
                    conn.send(("ok", dict(released)))
                elif cmd == "flip":
                    conn.send(("ok", _flip_bit(caches[which], *args)))
            except Exception as e:
                conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        for s in senders:
            s.close()


def _flip_bit(cache: torch.Tensor, block: int) -> bool:
    """Flip one bit of `block` in a sender's cache, in place (as if the engine had reused the block)."""
    plane = cache[1, 0, block].view(-1).view(torch.uint8)  # the v plane of the first layer
    plane[plane.numel() // 2] ^= 0x10
    if cache.is_cuda:
        torch.cuda.synchronize(cache.device)
    return True


class SenderProc:
    """A process holding one started sender per CacheSpec."""

    def __init__(self, transport: str, specs: list[CacheSpec], start_timeout: float = 60.0, **config_kw):
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.specs = specs
        self.proc = ctx.Process(target=_sender_main, args=(child, transport, specs, config_kw), daemon=True)
        self.proc.start()
        child.close()
        if not self._conn.poll(start_timeout):
            self.kill()
            raise TimeoutError("sender process did not start")
        self.addresses: list[str] = self._conn.recv()  # each sender's control socket

    def _call(self, cmd: str, which: int, *args, timeout: float = 10.0):
        self._conn.send((cmd, which, args))
        if not self._conn.poll(timeout):
            raise TimeoutError(f"sender process did not answer {cmd}")
        status, value = self._conn.recv()
        if status != "ok":
            raise RuntimeError(value)
        return value

    def publish(
        self,
        request_id: str,
        block_ids: list[int],
        lease_s: float | None = None,
        which: int = 0,
        block_hashes: list[int] = (),
    ):
        return self._call("publish", which, request_id, block_ids, lease_s, list(block_hashes))

    def cancel(self, request_id: str, which: int = 0) -> bool:
        return self._call("cancel", which, request_id)

    def flip_bit(self, block: int, which: int = 0) -> None:
        """Flip one bit of `block` in sender `which`'s cache (flipping it again restores the block)."""
        self._call("flip", which, block)

    def released(self) -> dict[str, tuple[str, str | None]]:
        return self._call("released", 0)

    def wait_released(self, request_ids: list[str], timeout: float = 10.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            got = self.released()
            if all(r in got for r in request_ids) or time.monotonic() > deadline:
                return {r: got[r] for r in request_ids if r in got}
            time.sleep(0.02)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(5)

    def stop(self) -> None:
        if self.proc.is_alive():
            with contextlib.suppress(BrokenPipeError, OSError):
                self._conn.send(("stop", 0, ()))
            self.proc.join(10)
        if self.proc.is_alive():
            self.kill()


def wait_results(receiver, request_ids: list[str], timeout: float = 20.0) -> dict:
    """Poll until every request has a result (or the timeout passes); returns request_id -> result."""
    out = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not all(r in out for r in request_ids):
        for res in receiver.poll():
            out[res.request_id] = res
        time.sleep(0.005)
    return out


def bits(t: torch.Tensor) -> torch.Tensor:
    """An integer view for bitwise comparison (NaN-safe, -0.0 != 0.0)."""
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.contiguous().view(ints[t.element_size()])


def closed_port_address() -> str:
    """A tcp address on which nothing listens (bound to an ephemeral port, then closed)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"tcp://127.0.0.1:{port}"


DST_BLOCKS = 40
# Three concurrent requests: non-contiguous, unordered src and dst ids, disjoint dst sets.
REQUESTS = [
    ([3, 17, 5, 40, 41], [39, 0, 22, 7, 13]),
    ([0], [21]),
    ([47, 46, 45, 44, 10, 11, 12], [1, 3, 5, 30, 31, 2, 38]),
]


def chain_for(num_blocks: int, seed: str) -> list[int]:
    """A prompt's block-hash chain for `num_blocks` blocks, the last one partly filled (so unhashed)."""
    from common.wire.hashing import block_hashes

    tokens = [hash((seed, i)) % 1000 for i in range(16 * num_blocks - 3)]
    return block_hashes(tokens, 16)


def check_concurrent_transfers(proc: SenderProc, which: int, receiver, cache: torch.Tensor, tag: str) -> None:
    """Publish REQUESTS on sender `which` of `proc`, fetch them all at once into `cache` (DST_BLOCKS
    blocks), and check: DONE with the right byte counts, exactly the dst blocks hold bitwise the src
    blocks, every other block is untouched, and the sender released every request as DONE."""
    from kvtransfer import TransferStatus

    spec = proc.specs[which]
    before = cache.clone()
    rids = [f"{tag}-{spec.dtype}-{i}" for i in range(len(REQUESTS))]
    chains = [chain_for(len(src), f"{tag}-{i}") for i, (src, _) in enumerate(REQUESTS)]
    handoffs = [
        proc.publish(rid, src, which=which, block_hashes=chain)
        for rid, (src, _), chain in zip(rids, REQUESTS, chains, strict=True)
    ]
    for handoff, (_, dst), chain in zip(handoffs, REQUESTS, chains, strict=True):
        receiver.fetch(handoff, dst, timeout_s=30, block_hashes=chain)
    results = wait_results(receiver, rids, timeout=40)

    expected = spec.make().to(cache.device)
    block_bytes = expected[:, :, 0].numel() * expected.element_size()
    for rid, (src, dst) in zip(rids, REQUESTS, strict=True):
        assert results[rid].status is TransferStatus.DONE, results[rid].error
        assert results[rid].num_bytes == len(src) * block_bytes
        assert receiver.status(rid) is TransferStatus.DONE
        assert torch.equal(bits(cache[:, :, dst]), bits(expected[:, :, src]))
    untouched = sorted(set(range(DST_BLOCKS)) - {b for _, dst in REQUESTS for b in dst})
    assert torch.equal(bits(cache[:, :, untouched]), bits(before[:, :, untouched]))
    released = proc.wait_released(rids)
    assert all(released[rid][0] == "done" for rid in rids), released
