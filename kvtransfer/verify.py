"""Verified hand-offs: what binds a transfer to its request, and the checks a receiver makes before it
reports DONE (so before the decode engine's first step on the blocks).

A transfer is bound to three things:

* the request: a random `nonce` the sender draws for each publication and writes into the hand-off that
  `publish()` returns (the prefill worker puts that `HandOff` in its DecodeRequest);
* the sender's `epoch`: random, drawn once when the sender starts, so a restarted sender (or another
  process at the same address) is told apart from the one that published;
* the prompt's block-hash chain (`common.wire.hashing`): the prefill worker hands `publish()` the hash of each
  full prompt block, and the sender reports, for every block id it serves, the hash it recorded for it.

Where the sender reads the blocks it also reports a checksum per block of the bytes it read, and the
receiver compares them with its own over the bytes it received. On the GPU they come out of the kernel
that moves the bytes (`block_copy.py`: the copy accumulates each block's checksum as it goes, so no
pass reads the bytes again): the ipc receiver's copy adds the received blocks' sums to the negated sent
ones, on the device, and reads the residuals back with the copy's completion; nccl's scatter does the
same, its sender's gather takes the sent sums; the ipc sender, which moves nothing, takes them with a
read-only pass of the kernel when it publishes. On the CPU (tcp's host buffers, gloo) the torch form
below computes them. The receiver
compares: nonce and epoch with the hand-off it was given, the reported hashes with the chain it computed
itself from the prompt's tokens, and the checksums. Any difference fails the transfer closed: FAILED,
and the decode worker recomputes the prompt instead of decoding on blocks it cannot trust.

The checksum (`block_checksums` defines it; the Triton kernel matches it bit for bit) is, per (k/v,
layer) plane of a block, the wrapping sum of its 64-bit words (of its bytes, where a plane's share of a
block is not a whole number of words), the planes weighted by distinct odd numbers (1, 3, 5, ...) and
summed, wrapping: any single flipped bit, a block swapped for another, and a plane swapped for another
change it. Wrapping sums do not depend on the order of the additions, which is what lets the kernel's
programs add their parts in any order. It is meant to catch corruption and mix-ups, not an adversary
(that is CURVE's job).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import numpy as np
import torch

from common.wire.handoff import HandOff
from common.wire.kv_messages import KVBinding


class VerificationFailed(Exception):
    """What arrived is not what was published for this request: the transfer must not be used."""


def new_token() -> int:
    """A random 63-bit nonce or epoch (fits msgpack's signed ints on every peer)."""
    return secrets.randbits(63)


def checksum_word(plane_block_bytes: int) -> torch.dtype:
    """The word a checksum sums for blocks whose share of one plane is `plane_block_bytes` bytes."""
    return torch.int64 if plane_block_bytes % 8 == 0 else torch.uint8


def block_checksums(blocks: torch.Tensor) -> torch.Tensor:
    """One int64 checksum per block of `blocks` ([2 * num_layers, n, block_elems], contiguous), computed
    on the tensor's own device with torch ops. The definition; the GPU paths use `block_copy.py`."""
    planes, n = blocks.shape[0], blocks.shape[1]
    raw = blocks.reshape(planes, n, -1).view(torch.uint8)
    if checksum_word(raw.shape[2]) == torch.int64:  # whole 64-bit words, no widening
        sums = raw.view(torch.int64).sum(dim=2)
    else:
        sums = raw.sum(dim=2, dtype=torch.int64)
    return (sums * plane_weights(planes, blocks.device)[:, None]).sum(dim=0)


def plane_weights(planes: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The odd weight of each plane's sum in a block's checksum: plane p counts 2p + 1 times."""
    return torch.arange(1, 2 * planes, 2, dtype=torch.int64, device=device)


def check_binding(
    handoff: HandOff, binding: KVBinding | None, expected_hashes: Sequence[int] | None, num_blocks: int
) -> None:
    """Raise VerificationFailed unless the sender's reply `binding` matches the `handoff` this request
    was given (nonce, epoch) and the prompt's chain (`expected_hashes`: the full blocks' hashes; the
    blocks after them, a partly filled last one, carry none)."""
    if binding is None:
        raise VerificationFailed("the sender's reply carries no binding (nonce, epoch, hashes)")
    for key, meaning in (("nonce", "published for another request"), ("epoch", "from another sender epoch")):
        want, got = getattr(handoff, key), getattr(binding, key)
        if got != want:
            raise VerificationFailed(f"the transfer is {meaning} ({key} {got!r}, expected {want})")
    if expected_hashes is None:
        return
    want_hashes = [*expected_hashes, *([None] * (num_blocks - len(expected_hashes)))]
    got_hashes = binding.hashes
    if len(got_hashes) != num_blocks:
        raise VerificationFailed(f"the sender reported no block hashes for the {num_blocks} blocks")
    for i, (got, want) in enumerate(zip(got_hashes, want_hashes, strict=True)):
        if got != want:
            raise VerificationFailed(
                f"block {i} holds hash {got!r} at the sender, the prompt's chain has {want!r} (wrong blocks)"
            )


def check_checksums(sent: object, received: torch.Tensor, first: int = 0) -> None:
    """Raise VerificationFailed unless the sender's per-block checksums `sent` equal `received` (the
    receiver's own `block_checksums`); `first` numbers the blocks in the message."""
    got = received.tolist()
    if not isinstance(sent, list) or len(sent) != len(got):
        raise VerificationFailed(f"the sender sent no checksums for blocks {first}..{first + len(got) - 1}")
    for i, (a, b) in enumerate(zip(sent, got, strict=True)):
        if a != b:
            raise VerificationFailed(f"block {first + i}: checksum {b} of the bytes received, {a!r} sent")


def pack_sums(sums: torch.Tensor) -> bytes:
    """Per-block checksums as they travel (ipc's hand-off, nccl's `KVReady`): little-endian int64s, 8 bytes
    a block, so a receiver takes them in one step however many blocks there are."""
    return sums.cpu().numpy().astype("<i8", copy=False).tobytes()


def unpack_sums(raw: object, count: int) -> torch.Tensor:
    """The `count` checksums `pack_sums` made, as an int64 CPU tensor; VerificationFailed if the sender
    sent none (a sender that does not verify) or not that many."""
    if isinstance(raw, bytes) and len(raw) == 8 * count:
        return torch.from_numpy(np.frombuffer(raw, dtype="<i8").astype(np.int64))
    raise VerificationFailed(f"the sender sent no checksums for its {count} blocks")


def check_residuals(residuals: torch.Tensor, sent: torch.Tensor, first: int = 0) -> None:
    """Raise VerificationFailed unless every residual is 0. `residuals` (int64, CPU) are what a checking
    copy left (received minus `sent`, wrapping): the copy's sums added to the negated sent ones."""
    bad = residuals.nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        received = int((sent[i] + residuals[i]).item())  # int64 arithmetic: wraps as the sums do
        raise VerificationFailed(
            f"block {first + i}: checksum {received} of the bytes received, {int(sent[i])} sent"
        )
