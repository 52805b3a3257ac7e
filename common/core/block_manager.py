"""Paged KV block allocation with reference counts and an LRU prefix cache.

Invariants:
* A block is either owned (ref_count > 0, listed in at least one sequence's block table) or sits in
  the free queue (ref_count == 0). The free queue is in LRU order: the front is evicted first.
* A free block may still carry a hash: its content is a valid cached prefix block and can be
  revived by a later request with the same prefix. It loses the hash (and a `removed` event is
  emitted) only when it is taken for fresh content.
* `hash_to_block` maps each registered hash to exactly one block whose `block_hash` is that hash.
* Only full blocks whose every token has been computed are registered, so a hit is always valid KV.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from common.core.sequence import Sequence
from common.wire.blocks import blocks_for
from common.wire.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None


@dataclass(frozen=True)
class PrefixMatch:
    """Leading cached blocks a sequence can reuse."""

    block_ids: tuple[int, ...]
    num_tokens: int


@dataclass
class CacheStats:
    queried_tokens: int = 0
    hit_tokens: int = 0
    evictions: int = 0


class BlockManager:
    def __init__(
        self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True, record_events: bool = True
    ) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.hash_to_block: dict[int, int] = {}
        self.stats = CacheStats()
        # Whether events are kept for `drain_events`: off where nobody drains them (they would pile up).
        self.record_events = record_events
        self._events: list[KVEvent] = []
        # Evictions since the last other event, published as one BlockRemoved: a full cache evicts a
        # block for nearly every block allocated (tens per admitted prompt), and each event costs the
        # worker, its I/O process and every router front a message object to encode and apply.
        self._removed: list[int] = []

    # ---- queries -------------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def match_prefix(self, seq: Sequence) -> PrefixMatch:
        """Longest run of cached leading blocks, leaving at least one token to compute."""
        if not self.enable_prefix_caching:
            return PrefixMatch((), 0)
        hashes = seq.full_block_hashes(len(seq) - 1)
        ids = []
        for h in hashes:
            block_id = self.hash_to_block.get(h)
            if block_id is None:
                break
            ids.append(block_id)
        return PrefixMatch(tuple(ids), len(ids) * self.block_size)

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Fresh blocks the table must grow by to hold `num_tokens` tokens."""
        have = len(seq.block_table)
        return max(0, blocks_for(num_tokens, self.block_size) - have)

    def can_admit(self, seq: Sequence, match: PrefixMatch, num_tokens: int) -> bool:
        revived = sum(1 for b in match.block_ids if self.blocks[b].ref_count == 0)
        total = blocks_for(num_tokens, self.block_size)
        return total - len(match.block_ids) <= self.num_free_blocks - revived

    # ---- mutations -----------------------------------------------------------------------------
    def admit(self, seq: Sequence, match: PrefixMatch, num_tokens: int) -> None:
        """Reuse `match`'s blocks, then allocate fresh ones to cover `num_tokens` tokens."""
        if seq.block_table:
            raise ValueError(f"sequence {seq.seq_id} already holds blocks")
        for block_id in match.block_ids:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_queue[block_id]
            block.ref_count += 1
            seq.block_table.append(block_id)
        seq.set_cached_prefix(match.num_tokens)
        seq.num_registered_blocks = len(match.block_ids)
        self.stats.queried_tokens += len(seq)
        self.stats.hit_tokens += match.num_tokens
        if not self.grow(seq, num_tokens):
            raise ValueError("admit called without enough free blocks; check can_admit first")

    def grow(self, seq: Sequence, num_tokens: int) -> bool:
        """Extend the block table to hold `num_tokens` tokens; False (and no change) if out of blocks."""
        if num_tokens <= len(seq.block_table) * self.block_size:
            return True  # most decode steps: the last block has room
        need = self.blocks_needed(seq, num_tokens)
        if need > self.num_free_blocks:
            return False
        for _ in range(need):
            seq.block_table.append(self._take_free_block())
        return True

    def commit(self, seq: Sequence) -> None:
        """Register hashes of blocks that became full and computed (emits one `stored` event)."""
        if not self.enable_prefix_caching:
            return
        num_full = seq.num_cached_tokens // self.block_size
        if num_full <= seq.num_registered_blocks:
            return
        hashes = seq.full_block_hashes(num_full * self.block_size)
        start = seq.num_registered_blocks
        stored: list[int] = []
        first = -1
        for i in range(start, num_full):
            block = self.blocks[seq.block_table[i]]
            # A concurrent sequence may have registered the same content first; keep that block.
            if block.block_hash is None and hashes[i] not in self.hash_to_block:
                block.block_hash = hashes[i]
                self.hash_to_block[hashes[i]] = block.block_id
                first = i if first < 0 else first
                stored.append(hashes[i])
        seq.num_registered_blocks = num_full
        if stored and self.record_events:
            self._event(BlockStored(tuple(stored), hashes[first - 1] if first > 0 else None))

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's references; the tail blocks become the first eviction candidates."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_queue[block_id] = None
        seq.block_table = []
        seq.num_registered_blocks = 0

    def reset_prefix_cache(self) -> None:
        """Forget every cached hash of free blocks (emits `cleared`)."""
        for block_id in self.free_queue:
            block = self.blocks[block_id]
            if block.block_hash is not None:
                del self.hash_to_block[block.block_hash]
                block.block_hash = None
        self._event(AllBlocksCleared())

    def drain_events(self) -> list[KVEvent]:
        """The events since the last drain, in order (consecutive evictions as one BlockRemoved)."""
        self._flush_removed()
        events, self._events = self._events, []
        return events

    def _event(self, event: KVEvent) -> None:
        if not self.record_events:
            return
        self._flush_removed()  # order matters: a hash evicted and then stored again must end stored
        self._events.append(event)

    def _flush_removed(self) -> None:
        if self._removed:
            self._events.append(BlockRemoved(tuple(self._removed)))
            self._removed = []

    def cached_hashes(self) -> list[int]:
        return list(self.hash_to_block)

    def _take_free_block(self) -> int:
        block_id, _ = self.free_queue.popitem(last=False)
        block = self.blocks[block_id]
        if block.block_hash is not None:
            del self.hash_to_block[block.block_hash]
            if self.record_events:
                self._removed.append(block.block_hash)
            self.stats.evictions += 1
            block.block_hash = None
        block.ref_count = 1
        return block_id
