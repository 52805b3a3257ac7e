"""Cache events: every time a block's hash is registered or forgotten, the block manager says so.

The prefill worker publishes them to the router as they are (`common.wire.cache_messages.KVEventBatch`),
and the router's global prefix index mirrors each worker's cache exactly. On the wire each event is a
map of its fields plus its `KIND`: {"kind": "stored", "hashes": [...], "parent": int | None},
{"kind": "removed", "hashes": [...]}, {"kind": "cleared"} (see `common.wire.wire_fields`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from common.wire.wire_fields import Hash, HashChain


@dataclass(frozen=True)
class BlockStored:
    """Blocks with these chained hashes now hold content; `parent` is the hash before hashes[0]."""

    KIND: ClassVar[str] = "stored"
    hashes: HashChain
    parent: Hash | None


@dataclass(frozen=True)
class BlockRemoved:
    """These hashes were forgotten (their blocks were evicted for fresh content)."""

    KIND: ClassVar[str] = "removed"
    hashes: HashChain


@dataclass(frozen=True)
class AllBlocksCleared:
    """The whole cache was dropped."""

    KIND: ClassVar[str] = "cleared"


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared
