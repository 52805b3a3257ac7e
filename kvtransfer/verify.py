"""Verified hand-offs: what binds a transfer to its request, and the checks a receiver makes before it
reports DONE (so before the decode engine's first step on the blocks).

A transfer is bound to three things:

* the request: a random `nonce` the sender draws for each publication and writes into the endpoint that
  `publish()` returns (the prefill worker puts that endpoint in its DecodeRequest);
* the sender's `epoch`: random, drawn once when the sender starts, so a restarted sender (or another
  process at the same address) is told apart from the one that published;
* the prompt's block-hash chain (`common.hashing`): the prefill worker hands `publish()` the hash of each
  full prompt block, and the sender reports, for every block id it serves, the hash it recorded for it.

Where the sender reads the blocks it also reports a checksum per block of the bytes it read
(`block_checksums`: torch ops, so it runs where the bytes are, on the GPU for GPU caches and on the CPU
for tcp's host buffers). The receiver compares: nonce and epoch with the endpoint it was given, the
reported hashes with the chain it computed itself from the prompt's tokens, and the checksums with its
own over the bytes it received. Any difference fails the transfer closed: FAILED, and the decode worker
recomputes the prompt instead of decoding on blocks it cannot trust.

The checksum is a sum of 64-bit words per (k/v, layer) plane of a block (wrapping), the planes weighted
by distinct odd numbers: any single flipped bit, a block swapped for another, and a plane swapped for
another change it. It is meant to catch corruption and mix-ups, not an adversary (that is CURVE's job).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

import torch

from .layout import gather


class VerificationFailed(Exception):
    """What arrived is not what was published for this request: the transfer must not be used."""


def new_token() -> int:
    """A random 63-bit nonce or epoch (fits msgpack's signed ints on every peer)."""
    return secrets.randbits(63)


def block_checksums(blocks: torch.Tensor) -> torch.Tensor:
    """One int64 checksum per block of `blocks` ([2 * num_layers, n, block_elems], contiguous), computed
    on the tensor's own device; asynchronous on CUDA."""
    planes, n = blocks.shape[0], blocks.shape[1]
    raw = blocks.reshape(planes, n, -1).view(torch.uint8)
    if raw.shape[2] % 8 == 0:  # the fast path: whole 64-bit words, no widening
        sums = raw.view(torch.int64).sum(dim=2)
    else:
        sums = raw.sum(dim=2, dtype=torch.int64)
    weights = torch.arange(1, 2 * planes, 2, dtype=torch.int64, device=blocks.device)
    return (sums * weights[:, None]).sum(dim=0)


def cache_block_checksums(kv_cache: torch.Tensor, index: torch.Tensor, group: int = 64) -> torch.Tensor:
    """`block_checksums` of blocks `index` (a long tensor on the cache's device) of a cache, gathered
    `group` blocks at a time so the temporary stays small whatever the hand-over's size."""
    parts = [block_checksums(gather(kv_cache, index[i : i + group])) for i in range(0, index.numel(), group)]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64, device=kv_cache.device)


def binding_fields(nonce: int, epoch: int, hashes: Sequence[int | None]) -> dict[str, Any]:
    """The keys a sender adds to its reply so the receiver can check the binding."""
    return {"nonce": nonce, "epoch": epoch, "hashes": list(hashes)}


def check_binding(
    endpoint: dict, fields: dict, expected_hashes: Sequence[int] | None, num_blocks: int
) -> None:
    """Raise VerificationFailed unless the sender's reply `fields` match the `endpoint` this request was
    given (nonce, epoch) and the prompt's chain (`expected_hashes`: the full blocks' hashes; the blocks
    after them, a partly filled last one, carry none)."""
    for key, meaning in (("nonce", "published for another request"), ("epoch", "from another sender epoch")):
        want, got = endpoint.get(key), fields.get(key)
        if type(want) is not int:
            raise VerificationFailed(f"the endpoint carries no {key}: it was not made by publish()")
        if got != want:
            raise VerificationFailed(f"the transfer is {meaning} ({key} {got!r}, expected {want})")
    if expected_hashes is None:
        return
    want_hashes = [*expected_hashes, *([None] * (num_blocks - len(expected_hashes)))]
    got_hashes = fields.get("hashes")
    if not isinstance(got_hashes, list) or len(got_hashes) != num_blocks:
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
