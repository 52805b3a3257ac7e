"""The block kernel's checksums (kvtransfer/block_copy.py) against their torch definition
(`verify.block_checksums`), bit for bit, and the bytes it moves against the gather/scatter it replaces.

Runs on a CUDA machine (marked `gpu`) and, on the CPU, under the Triton interpreter when
`PDSERVE_TRITON_INTERPRET=1` (the kernel then runs on CPU tensors). Anywhere else the module skips.
Every cache is random bytes (so bf16/fp32 words include NaN patterns and every int64 sum wraps), and
every destination is poisoned, so a kernel that writes a byte it should not, or misses one, shows.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import triton_interpret

triton_interpret.setup_or_skip()
INTERPRET = triton_interpret.ENABLED

from kvtransfer import block_copy  # noqa: E402
from kvtransfer.layout import flat_view  # noqa: E402
from kvtransfer.verify import VerificationFailed, block_checksums, check_residuals  # noqa: E402

pytestmark = [pytest.mark.timeout(300)] + ([] if INTERPRET else [pytest.mark.gpu])
DEVICE = "cpu" if INTERPRET else "cuda"

# (dtype, num_layers, block_size, num_kv_heads, head_dim): whole 64-bit words per plane and block, an
# odd byte count (the bytes are summed), blocks larger than one kernel chunk (words and bytes), and
# SmolLM2's layout.
LAYOUTS = [
    (torch.bfloat16, 3, 8, 2, 32),
    (torch.float32, 2, 3, 1, 5),
    (torch.uint8, 1, 3, 1, 5),
    (torch.float16, 2, 1, 1, 3),
    (torch.float32, 1, 16, 2, 96),
    (torch.float16, 1, 9, 5, 25),
]
if not INTERPRET:
    LAYOUTS.append((torch.bfloat16, 30, 16, 3, 64))


@pytest.fixture(autouse=True)
def _kernel_everywhere(monkeypatch):
    """Under the interpreter the caches are CPU tensors: send them through the kernel all the same."""
    if INTERPRET:
        monkeypatch.setattr(block_copy, "_uses_kernel", lambda t: True)


def _cache(layout, num_blocks: int, seed: int) -> torch.Tensor:
    dtype, layers, block_size, heads, head_dim = layout
    shape = (2, layers, num_blocks, block_size, heads, head_dim)
    nbytes = torch.Size(shape).numel() * dtype.itemsize
    gen = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (nbytes,), generator=gen, dtype=torch.uint8)
    return raw.view(dtype).view(shape).to(DEVICE)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8).cpu()


def _ids(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, device=DEVICE)


def _reference(cache: torch.Tensor, ids: list[int]) -> torch.Tensor:
    """The definition, on the CPU, over the blocks gathered by torch."""
    return block_checksums(flat_view(cache.cpu())[:, ids].contiguous())


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda t: f"{str(t[0])[6:]}-{'x'.join(map(str, t[1:]))}")
def test_copy_checksums_equal_the_definition_and_move_exactly_the_blocks(layout) -> None:
    src, dst = _cache(layout, 23, seed=1), _cache(layout, 17, seed=2)
    before = dst.clone()
    src_ids, dst_ids = [22, 0, 9, 13, 4, 5, 17], [3, 16, 0, 8, 1, 12, 9]
    start = torch.randint(-(2**63), 2**63 - 1, (7,), generator=torch.Generator().manual_seed(3))
    sums = start.clone().to(DEVICE)  # the kernel adds to whatever is there, wrapping
    block_copy.copy_blocks(src, dst, _ids(src_ids), _ids(dst_ids), sums)
    assert torch.equal(sums.cpu(), start + _reference(src, src_ids))
    assert torch.equal(_bytes(dst[:, :, dst_ids]), _bytes(src[:, :, src_ids]))
    rest = sorted(set(range(17)) - set(dst_ids))
    assert torch.equal(_bytes(dst[:, :, rest]), _bytes(before[:, :, rest]))


@pytest.mark.parametrize("layout", LAYOUTS[:4], ids=lambda t: str(t[0])[6:])
def test_gather_scatter_and_read_only_sums_equal_the_definition(layout) -> None:
    cache = _cache(layout, 11, seed=4)
    ids = [10, 2, 7, 3]
    assert torch.equal(block_copy.checksum_blocks(cache, _ids(ids)).cpu(), _reference(cache, ids))
    sums = torch.zeros(4, dtype=torch.int64, device=DEVICE)
    blocks = block_copy.gather_blocks(cache, _ids(ids), sums)
    assert torch.equal(_bytes(blocks), _bytes(flat_view(cache)[:, ids]))
    assert torch.equal(sums.cpu(), _reference(cache, ids))
    target = _cache(layout, 6, seed=5)
    before = target.clone()
    again = torch.zeros(4, dtype=torch.int64, device=DEVICE)
    block_copy.scatter_blocks(target, _ids([5, 0, 3, 1]), blocks, again)
    assert torch.equal(again, sums)
    assert torch.equal(_bytes(target[:, :, [5, 0, 3, 1]]), _bytes(cache[:, :, ids]))
    assert torch.equal(_bytes(target[:, :, [2, 4]]), _bytes(before[:, :, [2, 4]]))


@pytest.mark.parametrize("layout", [LAYOUTS[0], LAYOUTS[2]], ids=["words", "bytes"])
def test_a_checking_copy_catches_one_flipped_bit(layout) -> None:
    """Started at the negated sent sums (what the receivers do), a clean copy leaves all zeros; a bit
    flipped in one source block after the sums were taken leaves exactly that block's residual."""
    src, dst = _cache(layout, 9, seed=6), _cache(layout, 9, seed=7)
    src_ids, dst_ids = [8, 1, 4, 6], [0, 5, 2, 7]
    sent = block_copy.checksum_blocks(src, _ids(src_ids)).cpu()
    residuals = sent.neg().to(DEVICE)
    block_copy.copy_blocks(src, dst, _ids(src_ids), _ids(dst_ids), residuals)
    check_residuals(residuals.cpu(), sent)
    plane_block = flat_view(src)[1, 4].view(torch.uint8)  # block 4 (the third pair), plane 1
    plane_block[plane_block.numel() // 2] ^= 0x04
    residuals = sent.neg().to(DEVICE)
    block_copy.copy_blocks(src, dst, _ids(src_ids), _ids(dst_ids), residuals)
    assert (residuals.cpu() != 0).tolist() == [False, False, True, False]
    with pytest.raises(VerificationFailed, match="block 2: checksum"):
        check_residuals(residuals.cpu(), sent)


def test_sums_must_be_one_int64_per_block() -> None:
    cache = _cache(LAYOUTS[0], 4, seed=8)
    with pytest.raises(ValueError, match="sums"):
        block_copy.copy_blocks(
            cache, cache.clone(), _ids([0, 1]), _ids([1, 0]), torch.zeros(3, dtype=torch.int64)
        )
    with pytest.raises(ValueError, match="sums"):
        block_copy.gather_blocks(cache, _ids([0, 1]), torch.zeros(2, dtype=torch.int32, device=DEVICE))
