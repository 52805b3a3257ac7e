"""The fronts' shared in-flight tally: one int64 slot per front in a small file all of them map.

Why this shape. Several fronts (deploy.launch --api-servers N) must share one `--max-running-requests`
bound, and the check runs on every request before its body is read, so it must cost next to nothing:
no round trip to another process, no lock. The launcher creates a file of N zeroed int64 slots in its
run directory (`create_slots`) and names the directory to each front (`--fronts-dir`); each front maps
the file (mmap: the pages are shared through the page cache, so a store is seen by every other front at
once) and writes only its own slot, the number of generation requests it holds. A front admits while
the sum of all slots is below the limit. One writer per slot needs no cross-process lock: a slot is an
aligned 8-byte word written by one store (memoryview's int64 item assignment), so a reader never sees
half of it. A plain file, not `multiprocessing.shared_memory`: its lifetime is the launcher's run
directory (removed with it, even after a crash of a front), and no resource tracker unlinks it when
one front exits.

Worst-case overshoot: a front reads the others' slots and writes its own without yielding to its event
loop, so it admits at most one request between a read and its write; when all N fronts race on the
last free place, each sees `limit - 1` and admits, so up to `limit + N - 1` requests are in flight.
With one front the bound is exact. A front that starts (or restarts: its old requests died with the
old process) sets its own slot to 0.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

SLOTS_FILE = "inflight.slots"
SLOT_BYTES = 8  # one int64 ("q") per front


def check_front_place(directory: object, front: object, name: str = "front") -> None:
    """A front's place among the fronts: the shared directory and its index (ValueError naming the
    field otherwise). Shared by the slots and the metrics snapshots, which live side by side."""
    if not isinstance(directory, str) or not directory:
        raise ValueError(f"directory must be a non-empty path, got {directory!r}")
    if isinstance(front, bool) or not isinstance(front, int) or front < 0:
        raise ValueError(f"{name} must be an int >= 0, got {front!r}")


def create_slots(directory: str | os.PathLike, count: int) -> Path:
    """The launcher's part: a file of `count` zeroed slots in `directory` (made if missing)."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be an int >= 1, got {count!r}")
    path = Path(directory) / SLOTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(count * SLOT_BYTES))
    return path


def reset_slot(directory: str | os.PathLike, index: int) -> None:
    """Zero front `index`'s slot: the launcher does so when that front died (its requests are gone),
    so the others regain its share before it is back."""
    slots = FrontSlots(str(directory), index)
    slots.open()  # opening a slot zeroes it
    slots.close()


class FrontSlots:
    """Front `index`'s view of the shared slots in `directory` (its `open` maps them)."""

    def __init__(self, directory: str, index: int) -> None:
        check_front_place(directory, index, "index")
        self.directory = directory
        self.index = index
        self._map: mmap.mmap | None = None
        self._slots: memoryview | None = None

    @property
    def count(self) -> int:
        """How many fronts share the slots (0 before `open`)."""
        return len(self._slots) if self._slots is not None else 0

    def open(self) -> None:
        """Map the launcher's file and zero this front's slot."""
        path = Path(self.directory) / SLOTS_FILE
        with open(path, "r+b") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0 or size % SLOT_BYTES:
                raise ValueError(f"{path} holds {size} bytes, not a whole number of int64 slots")
            self._map = mmap.mmap(f.fileno(), size)  # the mapping outlives the file object
        self._slots = memoryview(self._map).cast("q")
        if self.index >= len(self._slots):
            count = len(self._slots)
            self.close()
            raise ValueError(f"front {self.index} has no slot in {path} (it holds {count})")
        self._slots[self.index] = 0

    def set_own(self, value: int) -> None:
        assert self._slots is not None, "open() first"
        self._slots[self.index] = value

    def others(self) -> int:
        """Requests the other fronts hold now."""
        assert self._slots is not None, "open() first"
        return sum(self._slots) - self._slots[self.index]

    def close(self) -> None:
        if self._slots is not None:
            self._slots.release()
            self._slots = None
        if self._map is not None:
            self._map.close()
            self._map = None
