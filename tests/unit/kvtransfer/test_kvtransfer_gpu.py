"""GPU transfers (skipped without CUDA): ipc and tcp between two processes sharing one GPU, nccl between
two GPUs. Sender in a spawned process, receiver in this one, as on CPU."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
import torch
from kv_procs import DST_BLOCKS, SPECS, SenderProc, bits, chain_for, check_concurrent_transfers, wait_results

from kvtransfer import TransferStatus

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.timeout(300),
]
GPU0 = [spec.with_(device="cuda:0") for spec in SPECS]
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")


@pytest.fixture(scope="module")
def gpu_pool():
    procs: dict[str, SenderProc] = {}

    def get(transport: str) -> SenderProc:
        if transport not in procs:
            procs[transport] = SenderProc(transport, GPU0, chunk_bytes=8192)
        return procs[transport]

    yield get
    for proc in procs.values():
        proc.stop()


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
@pytest.mark.parametrize("which", [0, 1], ids=["bf16", "fp32"])
def test_one_gpu_two_processes_bitwise(gpu_pool, receivers, transport, which):
    cache = GPU0[which].with_(num_blocks=DST_BLOCKS, seed=7).make()
    receiver = receivers(transport, cache)
    check_concurrent_transfers(gpu_pool(transport), which, receiver, cache, tag=f"gpu-{transport}")


def test_ipc_failures_are_reported(gpu_pool, receivers):
    proc = gpu_pool("ipc")
    receiver = receivers("ipc", GPU0[0].with_(num_blocks=8).make())
    # Only a CUDA IPC export of a cache lets a receiver read the blocks.
    other = proc.publish("ipc-other", [1])
    forged = replace(other, ipc=replace(other.ipc, cache={"handle": b"x"}))
    receiver.fetch(forged, [1], timeout_s=10)
    assert "not a CUDA IPC export" in wait_results(receiver, ["ipc-other"])["ipc-other"].error

    lapsed = proc.publish("ipc-lease", [2], 0.3)
    assert proc.wait_released(["ipc-lease"], timeout=5)["ipc-lease"][0] == "failed"
    receiver.fetch(lapsed, [2], timeout_s=10)
    assert "lease ran out" in wait_results(receiver, ["ipc-lease"])["ipc-lease"].error

    handoff = proc.publish("ipc-dtype", [3, 4])
    mismatched = receivers("ipc", GPU0[1].with_(num_blocks=8).make())  # float32 vs the sender's bfloat16
    mismatched.fetch(handoff, [0, 1], timeout_s=10)
    assert "dtype mismatch" in wait_results(mismatched, ["ipc-dtype"])["ipc-dtype"].error
    assert proc.wait_released(["ipc-dtype"])["ipc-dtype"][0] == "failed"


def test_ipc_verifies_the_chain_before_and_the_bytes_after_the_copy(gpu_pool, receivers):
    """kvtransfer/verify.py over ipc: the hand-off's hashes must match the prompt's chain (checked on the
    host while the copy runs) and the checksums the sender took at publish time must match those the
    copy kernel took of what it copied; either failing is FAILED, and the sender released."""
    proc = gpu_pool("ipc")
    receiver = receivers("ipc", GPU0[0].with_(num_blocks=8, seed=3).make())
    chain = chain_for(3, "ipc-verify")
    handoff = proc.publish("ipc-verified", [5, 6, 7], block_hashes=chain)
    receiver.fetch(handoff, [0, 1, 2], timeout_s=10, block_hashes=chain)
    assert wait_results(receiver, ["ipc-verified"])["ipc-verified"].status is TransferStatus.DONE
    other_prompt = chain_for(3, "another prompt")  # the sender published blocks of another prompt
    handoff = proc.publish("ipc-wrong-blocks", [5, 6, 7], block_hashes=other_prompt)
    receiver.fetch(handoff, [0, 1, 2], timeout_s=10, block_hashes=chain)
    assert "wrong blocks" in wait_results(receiver, ["ipc-wrong-blocks"])["ipc-wrong-blocks"].error
    handoff = proc.publish("ipc-rewritten", [5, 6, 7], block_hashes=chain)
    sums = bytearray(handoff.ipc.sums)  # 8 bytes a block (verify.pack_sums)
    sums[8] ^= 1  # the second block's
    rewritten = replace(handoff, ipc=replace(handoff.ipc, sums=bytes(sums)))
    receiver.fetch(rewritten, [0, 1, 2], timeout_s=10, block_hashes=chain)
    assert "checksum" in wait_results(receiver, ["ipc-rewritten"])["ipc-rewritten"].error
    released = proc.wait_released(["ipc-wrong-blocks", "ipc-rewritten"])
    assert all(status == "failed" for status, _ in released.values()), released


def test_ipc_verified_end_to_end_catches_a_block_rewritten_after_publishing(gpu_pool, receivers):
    """Over ipc with verification on at both ends (the default), three requests travel in one copy: the
    two clean ones are DONE and bitwise exact; the one with a bit flipped in a published block after
    publishing (as if the sender had reused it) fails on that block alone, and the sender releases it
    as failed. The control: a receiver that does not verify copies the flipped bit and reports DONE."""
    proc, spec = gpu_pool("ipc"), GPU0[0]
    cache = spec.with_(num_blocks=DST_BLOCKS, seed=3).make()
    receiver = receivers("ipc", cache)
    jobs = {
        "ipc-clean-a": ([10, 11, 12], [0, 1, 2]),
        "ipc-flip": ([13, 14, 15], [3, 4, 5]),
        "ipc-clean-b": ([16], [6]),
    }
    chains = {rid: chain_for(len(src), rid) for rid, (src, _) in jobs.items()}
    handoffs = {rid: proc.publish(rid, src, block_hashes=chains[rid]) for rid, (src, _) in jobs.items()}
    proc.flip_bit(14)
    try:
        for rid, (_, dst) in jobs.items():
            receiver.fetch(handoffs[rid], dst, timeout_s=30, block_hashes=chains[rid])
        receiver.flush()
        assert len(receiver._copying) == 1  # one checked copy for all three
        results = wait_results(receiver, list(jobs))
        flipped = results["ipc-flip"]
        assert flipped.status is TransferStatus.FAILED and "block 1: checksum" in flipped.error, flipped.error
        expected = spec.make()
        for rid in ("ipc-clean-a", "ipc-clean-b"):
            src, dst = jobs[rid]
            assert results[rid].status is TransferStatus.DONE, results[rid].error
            assert torch.equal(bits(cache[:, :, dst]), bits(expected[:, :, src]))
        released = proc.wait_released(list(jobs))
        assert {rid: status for rid, (status, _) in released.items()} == {
            "ipc-clean-a": "done",
            "ipc-flip": "failed",
            "ipc-clean-b": "done",
        }
        plain = spec.with_(num_blocks=8).make()
        unverified = receivers("ipc", plain, verify=False)
        unverified.fetch(proc.publish("ipc-flip-unverified", [14]), [0], timeout_s=30)
        result = wait_results(unverified, ["ipc-flip-unverified"])["ipc-flip-unverified"]
        assert result.status is TransferStatus.DONE, result.error
        assert not torch.equal(bits(plain[:, :, 0]), bits(expected[:, :, 14]))
    finally:
        proc.flip_bit(14)  # the pool's sender is shared: restore the block


def test_ipc_batches_many_fetches_into_one_copy(gpu_pool, receivers):
    """Fetches queued before a flush travel together, and each is still reported and released once."""
    proc = gpu_pool("ipc")
    cache = GPU0[0].with_(num_blocks=DST_BLOCKS, seed=3).make()
    receiver = receivers("ipc", cache)
    rids = [f"ipc-batch-{i}" for i in range(12)]
    handoffs = [proc.publish(rid, [i, 47 - i]) for i, rid in enumerate(rids)]
    for i, handoff in enumerate(handoffs):
        receiver.fetch(handoff, [2 * i, 2 * i + 1], timeout_s=30)
    receiver.flush()
    assert len(receiver._copying) == 1  # one batch for the one sender
    results = wait_results(receiver, rids)
    expected = GPU0[0].make()
    for i, rid in enumerate(rids):
        assert results[rid].status is TransferStatus.DONE, results[rid].error
        assert torch.equal(cache[:, :, [2 * i, 2 * i + 1]], expected[:, :, [i, 47 - i]])
    released = proc.wait_released(rids)
    assert all(released[rid][0] == "done" for rid in rids), released


@pytest.mark.parametrize("transport", ["ipc", pytest.param("nccl", marks=two_gpus)])
def test_gpu_killed_sender_fails_within_timeout(receivers, transport):
    spec = GPU0[0]
    proc = SenderProc(transport, [spec])
    try:
        device = "cuda:1" if transport == "nccl" else "cuda:0"
        receiver = receivers(transport, spec.with_(num_blocks=8, device=device).make())
        handoff = proc.publish("before-kill", [1, 2])
        receiver.fetch(handoff, [0, 1], timeout_s=60)
        first = wait_results(receiver, ["before-kill"], timeout=70)["before-kill"]
        assert first.status is TransferStatus.DONE, first.error
        handoff = proc.publish("after-kill", [3, 4])
        proc.kill()
        t0 = time.monotonic()
        receiver.fetch(handoff, [2, 3], timeout_s=2.0)
        result = wait_results(receiver, ["after-kill"], timeout=10)["after-kill"]
        assert result.status is TransferStatus.FAILED and result.error
        assert time.monotonic() - t0 < 4.0
    finally:
        proc.stop()


def test_ipc_receiver_closes_the_mapping_of_a_sender_that_died(receivers):
    """While this process maps a dead sender's cache, the driver keeps that memory allocated on the GPU
    (a worker restarted there then cannot get its own cache: seen in the GPU chaos run). The receiver
    closes such mappings by itself within a sweep, with no fetch from that sender needed."""
    big = GPU0[0].with_(num_blocks=65536)  # 384 MiB in bf16
    proc = SenderProc("ipc", [big])
    try:
        receiver = receivers("ipc", GPU0[0].with_(num_blocks=8).make())
        receiver.fetch(proc.publish("map-it", [1, 2]), [0, 1], timeout_s=60)
        assert wait_results(receiver, ["map-it"], timeout=70)["map-it"].status is TransferStatus.DONE
        proc.kill()
        time.sleep(0.5)  # the driver has torn down the dead process's context by now
        pinned_free = torch.cuda.mem_get_info()[0]
        deadline, freed = time.monotonic() + 10, 0
        while time.monotonic() < deadline and freed < 300 << 20:
            receiver.poll()
            freed = torch.cuda.mem_get_info()[0] - pinned_free
            time.sleep(0.1)
        assert freed >= 300 << 20, f"only {freed >> 20} MiB came back after the sender died"
    finally:
        proc.stop()


@two_gpus
@pytest.mark.parametrize("which", [0, 1], ids=["bf16", "fp32"])
def test_nccl_two_gpus_bitwise(gpu_pool, receivers, which):
    cache = SPECS[which].with_(num_blocks=DST_BLOCKS, seed=7, device="cuda:1").make()
    check_concurrent_transfers(gpu_pool("nccl"), which, receivers("nccl", cache), cache, tag="gpu-nccl")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_block_copy_kernel_matches_gather_scatter(dtype):
    """The one-pass kernel writes exactly the dst blocks, bitwise the src blocks, on fresh random data."""
    from kvtransfer.block_copy import copy_blocks

    gen = torch.Generator().manual_seed(11)
    src = torch.randn(2, 3, 50, 8, 2, 24, generator=gen).to(dtype).cuda()  # block: 384 elements
    dst = torch.full((2, 3, 30, 8, 2, 24), float("nan"), dtype=dtype, device="cuda")  # poisoned
    src_ids, dst_ids = [49, 0, 17, 3, 33], [2, 29, 0, 14, 7]
    before = dst.clone()
    copy_blocks(src, dst, torch.tensor(src_ids, device="cuda"), torch.tensor(dst_ids, device="cuda"))
    torch.cuda.synchronize()
    assert torch.equal(bits(dst[:, :, dst_ids]), bits(src[:, :, src_ids]))
    rest = sorted(set(range(30)) - set(dst_ids))
    assert torch.equal(bits(dst[:, :, rest]), bits(before[:, :, rest]))
