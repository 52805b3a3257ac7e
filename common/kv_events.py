"""Cache events: every time a block's hash is registered or forgotten, the block manager says so.

The prefill worker publishes these to the router, whose global prefix index mirrors each worker's
cache exactly. `to_dict` gives the wire form used inside `common.messages.KVEventBatch`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BlockStored:
    """Blocks with these chained hashes now hold content; `parent` is the hash before hashes[0]."""

    hashes: tuple[int, ...]
    parent: int | None

    def to_dict(self) -> dict:
        return {"kind": "stored", "hashes": list(self.hashes), "parent": self.parent}


@dataclass(frozen=True)
class BlockRemoved:
    hashes: tuple[int, ...]

    def to_dict(self) -> dict:
        return {"kind": "removed", "hashes": list(self.hashes)}


@dataclass(frozen=True)
class AllBlocksCleared:
    def to_dict(self) -> dict:
        return {"kind": "cleared"}


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared
