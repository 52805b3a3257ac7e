"""Last-arrival merge of split programs: the rule every split kernel of the project shares.

A kernel that cuts one output tile's work over several programs (split-K projections, split-context
decode attention) merges the parts in the same launch instead of a second kernel: each program
stores its part, then draws a ticket from the tile's arrival counter (`arrive`); the program that
draws the last ticket has seen every other part, merges them and puts the counter back to 0
(`depart`). Counters are therefore zero between launches, so one persistent buffer serves every
launch in stream order and a CUDA graph replays with no reset kernel.

Memory ordering (why it is safe on the GPU): all threads of a program finish their part's stores
before the ticket (`debug_barrier`); the ticket is an acq_rel atomic at GPU scope, so the last
program's acquire sees every earlier program's released stores; the merging program must read the
parts with `cache_modifier=".cg"` (from L2: an SM's L1 is not coherent with other SMs' stores).

Imported only where Triton is (the kernels' modules), never on a CPU-only machine.
"""

from __future__ import annotations

from typing import Protocol

import torch
import triton
import triton.language as tl


@triton.jit
def arrive(counter_ptr, num_parts):
    """Call after this program's part is stored; True in the one program that arrives last of
    `num_parts` at `counter_ptr`, which must then merge (reading with ".cg") and call `depart`."""
    tl.debug_barrier()
    ticket = tl.atomic_add(counter_ptr, 1, sem="acq_rel")
    return ticket == num_parts - 1


@triton.jit
def depart(counter_ptr):
    """The last program, after its merge: the counter back to zero for the next launch."""
    tl.store(counter_ptr, 0)


# Inner-dimension parts a split projection kernel cuts its work into, at most.
MAX_SPLIT = 16


class SplitLaunch(Protocol):
    """A split projection kernel's launch: its tile and a fixed split (0: chosen from the shape)."""

    @property
    def block_n(self) -> int: ...

    @property
    def block_k(self) -> int: ...

    @property
    def split_k(self) -> int: ...


def split_to_fill(n: int, k: int, launch: SplitLaunch, target_programs: int) -> int:
    """Inner-dimension parts for an [n, k] weight read in [block_n, block_k] tiles: the launch's own
    split when it fixes one, else doubled until the column blocks times the parts reach
    `target_programs` (enough weight loads in flight to fill the GPU), at most MAX_SPLIT, and never so
    far that a part would hold less than one `block_k` tile."""
    if launch.split_k:
        return launch.split_k
    blocks, split = triton.cdiv(n, launch.block_n), 1
    while blocks * split < target_programs and split < MAX_SPLIT and k // (2 * split) >= launch.block_k:
        split *= 2
    return split


class ArrivalCounters:
    """Zeroed int32 arrival counters per device, one buffer per kernel family.

    Invariant: every counter is zero whenever no launch is in flight (`depart`). A buffer is only
    allocated outside CUDA-graph capture (a capture's warm-up call sizes it) and is never freed:
    a graph captured earlier keeps replaying into the buffer it was captured with, even after a
    larger eager step has grown a new one.
    """

    def __init__(self, name: str, min_size: int) -> None:
        if min_size < 1:
            raise ValueError(f"ArrivalCounters({name!r}): min_size must be >= 1, got {min_size}")
        self.name, self.min_size = name, min_size
        self._current: dict[torch.device, torch.Tensor] = {}
        self._retired: list[torch.Tensor] = []

    def get(self, device: torch.device, size: int) -> torch.Tensor:
        """A zeroed counter buffer of at least `size` entries on `device`."""
        buf = self._current.get(device)
        if buf is not None and buf.numel() >= size:
            return buf
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"{self.name}: {size} arrival counters needed during CUDA-graph capture, "
                f"{0 if buf is None else buf.numel()} allocated; run the same call once before capturing"
            )
        grown = max(size, self.min_size, 0 if buf is None else 2 * buf.numel())
        if buf is not None:
            self._retired.append(buf)
        self._current[device] = torch.zeros(grown, dtype=torch.int32, device=device)
        return self._current[device]
