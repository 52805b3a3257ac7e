"""fp8 KV blocks over the tcp transport (a sender in a spawned process, real sockets): values and their
scales arrive bit for bit, and a cache of another dtype is refused with a message naming the flags."""

from __future__ import annotations

import pytest
import torch
from kv_procs import CacheSpec, SenderProc, bits, wait_results

from common.attention import kv_fp8
from kvtransfer import TransferStatus

pytestmark = pytest.mark.timeout(120)

FP8 = CacheSpec(dtype="fp8", num_blocks=24, block_size=16, seed=5)


@pytest.fixture(scope="module")
def fp8_sender():
    proc = SenderProc("tcp", [FP8], chunk_bytes=4096)  # several chunks per request
    yield proc
    proc.stop()


def test_fp8_blocks_and_scales_arrive_bit_for_bit(fp8_sender, receivers):
    src = FP8.make()  # the sender's cache, rebuilt here from the same seed
    dst = torch.zeros(kv_fp8.cache_shape(3, 10, 16, 2, 32, kv_fp8.FP8_DTYPE), dtype=kv_fp8.FP8_DTYPE)
    src_ids, dst_ids = [7, 2, 19, 20], [9, 0, 4, 5]
    handoff = fp8_sender.publish("fp8-1", src_ids)
    receiver = receivers("tcp", dst)
    receiver.fetch(handoff, dst_ids, timeout_s=20)
    result = wait_results(receiver, ["fp8-1"])["fp8-1"]
    assert result.status is TransferStatus.DONE, result.error
    assert torch.equal(bits(dst[:, :, dst_ids]), bits(src[:, :, src_ids]))
    untouched = [b for b in range(10) if b not in dst_ids]
    assert not bits(dst[:, :, untouched]).any()
    # What the decode side reads: the dequantised keys and values of every layer, scales included.
    for (sk, sv), (dk, dv) in zip(kv_fp8.layer_views(src, 16), kv_fp8.layer_views(dst, 16), strict=True):
        for s, d in ((sk, dk), (sv, dv)):
            expected = kv_fp8.gather(s, torch.tensor(src_ids), torch.float32)
            assert torch.equal(kv_fp8.gather(d, torch.tensor(dst_ids), torch.float32), expected)
            assert expected.abs().amax() > 1.0  # real values (the scales were applied), not zeros


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_an_fp8_sender_and_a_full_precision_receiver_refuse_to_pair(fp8_sender, receivers, dtype):
    rid = f"fp8-vs-{dtype}"
    handoff = fp8_sender.publish(rid, [1, 2])
    receiver = receivers("tcp", FP8.with_(dtype=dtype, block_size=16, num_blocks=8).make())
    receiver.fetch(handoff, [0, 1], timeout_s=10)
    result = wait_results(receiver, [rid])[rid]
    assert result.status is TransferStatus.FAILED
    assert f"sender float8_e4m3fn, receiver {dtype}" in result.error and "--kv-cache-dtype" in result.error
    released = fp8_sender.wait_released([rid])
    assert released[rid][0] == "failed" and "dtype mismatch" in released[rid][1]
