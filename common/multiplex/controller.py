"""Which SM share the next prefill chunk gets: a load-following split (pure Python, no torch).

The lanes form a ladder, smallest share first, the whole device last. The controller keeps one rung:
* no decode batch running when a chunk starts: the chunk gets the whole device (top rung), and the
  rung is left as it was (that chunk's decode gaps say nothing about it);
* otherwise, the decode output gaps (one step's tokens to the next's) measured beside the previous
  chunk on the rung decide: their `QUANTILE` above the inter-token target -> one rung down (decode
  gets more SMs); below `grow_below` x target -> one rung up (prefill gets more), but never to the
  whole device while decode runs; in between -> stay. (On the H200, 8B shape, the chunks that ran on
  the whole device beside decode steps made the longest gaps, up to 244 ms: a decode kernel waits
  there for the prefill GEMM's waves to drain; on a share it always has SMs of its own.
  docs/benchmarks.md.)
With `lowest_rung` (on by default; `PDSERVE_MUX_GRAPH_FLOOR=0` turns it off) the ladder's lowest
rung is the smallest share with prefill graphs when some shares have them and smaller ones do not
(`launch_knobs.graph_floor`). Why: a share without graphs launches its chunks eager, and the engine
thread's launch (20-80 ms per 8B-shape chunk on an H100, session 32) is itself a gap for every
decoding stream, so stepping down onto such a share to shorten the gaps lengthens them, and the rule
then steps further down (the collapse described under `solo_ratio`). Served in session 36 (H100, 8B
shape, two long prompts a second): with it ratio 2 held 4,700 tok/s, where it had fallen to 2,304.
Decode never needs a share of its own: only prefill is restricted, so with no prefill waiting the
decode steps have every SM. There is no fixed table: the rung follows the measured gaps, which move
with the decode batch size, its contexts and the model.

With `solo_ratio` (`--itl-target-solo-ratio R`, 2 by default) the target is R x the
median of the recent decode gaps with no chunk in flight (`SOLO_WINDOW` of them), capped by the
configured target: a fixed target in ms means a different share on every card and model. Why
(docs/benchmarks.md, sessions 30-31): a decode step beside even the smallest share costs 1.3-1.5x its
solo time, so a target under ~1.5x solo sinks to the smallest share and starves prefill (12 ms on an
H100, 8B shape: 1.5x its 7.9-ms step), while 12 ms on an H200 (2.0x its 6.0-ms step) halved the chat
ITL p99 at the same throughput; ratio 2 on the H100 cut it to 0.71x of the fixed 30 ms at 0.96x the
throughput. Without `lowest_rung` it collapsed: at two long prompts a second (H100, 8B shape, session
32) its shares fell to 44-68 SMs, where chunks launch eager, the slow launches counted as gaps over
the target and shrank the shares further, and prefill fell behind for good. With the floor (session
36) it held there: 0.65-0.70x the fixed target's chat ITL p99 at 0.97-1.00x its throughput, at one
and two long prompts a second; the cost is the long prompts' TTFT p99, 0.66-0.68 -> 1.05-1.07 s.

With `drain` (opt-in, `--mux-split drain`) the target is the configured one, the cap, while prefill is
behind (prompt tokens left after a full chunk, or prompts left waiting), and the solo-ratio one
otherwise: the ratio is a preference while prefill keeps up, the cap a bound. Why: at one long prompt
per second on an H100 (8B shape, session 31) the ratio's smaller shares already raised the long
prompts' TTFT p99 from 0.73 to 1.09 s; at two a second (session 32) they left it behind for good,
and with `drain` they did not (4,694 tok/s against ratio 2's 2,304).

With `knee` (opt-in, `--mux-split knee`) the rung also stops at the knee of the measured gap-per-rung
curve while prefill keeps up: each rung keeps the gap last measured on it, and a rung whose gap is more
than `STEP` x the gap of the rung below goes one down, a climb stops below a rung known to cost that
much more, and a rung that stays while the one below is unknown measures it (a flat curve climbs back);
estimates older than `STALE_CHUNKS` chunks are forgotten, so the curve is measured again as the decode
batch changes. When prefill falls behind (prompt tokens left after a full chunk) the target
rule alone decides. Why: fixed shares on an H100 (8B shape, 64 decode rows; docs/benchmarks.md) slowed
a decode step from 7.1 ms alone to ~10.2 ms at every share of 32-64 SMs (the cost of any prefill beside
it), then 12.2 / 14.4 / 18.1 ms at 80 / 96 / 112, while prefill's rate rose from 7,200 to 14,300 tokens/s
at 32-64 SMs and 18,800-23,900 above: the target rule at 30 ms climbs to 112 SMs (it grows while gaps
stay under 18 ms). A ratio to decode's solo gap does not find this knee: at 1.25x solo it drove every
chunk to 32 SMs, where prefill fell behind (the first form of `knee`, same call).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

QUANTILE = 0.9  # of the decode gaps beside one chunk: one slow outlier step does not move the split
STEP = 1.1  # with `knee`: a rung whose gap exceeds the rung below's by more than this costs decode
STALE_CHUNKS = 16  # with `knee`: a rung's gap older than this many chunks is measured again
SOLO_WINDOW = 64  # with `solo_ratio`: the solo decode gaps whose median scales the target


def check_solo_ratio(name: str, ratio: object) -> None:
    """ValueError naming `name` unless `ratio` is 0 (off) or a number above 1 (a target under the
    solo gap could never be held)."""
    valid = isinstance(ratio, int | float) and not isinstance(ratio, bool)
    if not valid or not (ratio == 0 or 1 < ratio < 1e3):
        raise ValueError(f"{name} must be 0 (off) or a number above 1, got {ratio!r}")


def check_drain_has_ratio(drain_name: str, drain: bool, ratio_name: str, ratio: float) -> None:
    """`drain` chooses between the solo-ratio target and the cap while prefill is behind: with no ratio
    the two are the same and the rule would change nothing, so it is refused (ValueError naming it)."""
    if drain and not ratio:
        raise ValueError(f"{drain_name} needs {ratio_name} > 0 (it holds the cap while prefill is behind)")


@dataclass(frozen=True)
class ControllerConfig:
    """`itl_target_s`: the decode inter-token gap to hold; `grow_below`: the fraction of the target
    under which the prefill share grows; `num_lanes`: rungs of the ladder (the last: whole device);
    `knee`: stop at the knee of the gap-per-rung curve while prefill keeps up; `solo_ratio`: > 0 holds
    that multiple of the solo decode gap instead, at most `itl_target_s`; `drain`: while prefill is
    behind, hold `itl_target_s` itself; `lowest_rung`: the rung the share never goes below while decode
    runs (the module docstring)."""

    itl_target_s: float
    num_lanes: int
    grow_below: float = 0.6
    knee: bool = False
    solo_ratio: float = 0.0
    drain: bool = False
    lowest_rung: int = 0

    def __post_init__(self) -> None:
        if not self.itl_target_s > 0:
            raise ValueError(f"itl_target_s must be positive, got {self.itl_target_s!r}")
        if isinstance(self.num_lanes, bool) or not isinstance(self.num_lanes, int) or self.num_lanes < 1:
            raise ValueError(f"num_lanes must be a positive int, got {self.num_lanes!r}")
        if not 0 < self.grow_below < 1:
            raise ValueError(f"grow_below must be in (0, 1), got {self.grow_below!r}")
        for name in ("knee", "drain"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        rung = self.lowest_rung
        top = max(self.num_lanes - 2, 0)  # the largest share's rung: where a chunk beside decode may go
        if isinstance(rung, bool) or not isinstance(rung, int) or not 0 <= rung <= top:
            raise ValueError(f"lowest_rung must be an int from 0 to num_lanes - 2 ({top}), got {rung!r}")
        if self.knee and self.drain:
            raise ValueError("knee and drain are two split rules: choose one")
        check_solo_ratio("solo_ratio", self.solo_ratio)
        check_drain_has_ratio("drain", self.drain, "solo_ratio", self.solo_ratio)


class ShareController:
    """Picks a lane index per prefill chunk (`next_lane`) from the decode gaps beside chunks
    (`decode_output`, `observe_decode`) and, with `solo_ratio`, those without one (`observe_solo`)."""

    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        # Start in the middle (half the device or so), or on the lowest rung when that is higher.
        self.rung = max((config.num_lanes - 1) // 2, config.lowest_rung)
        self._chunk_rung: int | None = None  # the rung of the chunk in flight (None: whole, forced)
        self._gaps: list[float] = []
        self._chunks = 0  # chunks started beside decode: the clock of the per-rung estimates
        self._rung_gaps: dict[int, tuple[float, int]] = {}  # rung -> (gap measured there, at chunk)
        self._solo: deque[float] = deque(maxlen=SOLO_WINDOW)
        self._last_output: float | None = None  # when the last decode tokens reached the host

    @property
    def whole(self) -> int:
        return self.config.num_lanes - 1

    @property
    def top_beside_decode(self) -> int:
        """The highest rung a chunk gets while decode runs: the largest share short of the whole
        device (the whole device only when it is the one lane there is)."""
        return max(self.whole - 1, 0)

    def next_lane(self, decoding: bool, behind: bool = False) -> int:
        """The lane of the chunk about to start; `decoding`: a decode batch runs beside it; `behind`:
        prompt tokens are left waiting after it (prefill is not keeping up)."""
        self._adjust(behind)
        if not decoding:
            self._chunk_rung = None
            return self.whole
        self._chunks += 1
        self._chunk_rung = self.rung
        return self.rung

    def decode_output(self, now: float, beside_chunk: bool) -> bool:
        """Decode tokens reached the host at `now` (perf_counter seconds): the gap since the last ones
        is observed, beside a chunk or solo; True when it was a gap beside a chunk."""
        last, self._last_output = self._last_output, now
        if last is None:
            return False
        if beside_chunk:
            self.observe_decode(now - last)
        else:
            self.observe_solo(now - last)
        return beside_chunk

    def decode_paused(self) -> None:
        """No sequence decodes: the next decode output starts no gap."""
        self._last_output = None

    def observe_decode(self, seconds: float) -> None:
        """One gap between two decode steps' outputs, measured while the current chunk was in flight."""
        if self._chunk_rung is not None:
            self._gaps.append(seconds)

    def observe_solo(self, seconds: float) -> None:
        """One gap between two decode steps' outputs with no chunk in flight (kept with `solo_ratio`)."""
        if self.config.solo_ratio:
            self._solo.append(seconds)

    @property
    def target(self) -> float:
        """The gap the split holds now: the configured target, or with `solo_ratio` that multiple of the
        recent solo gaps' median when it is smaller (the configured one until a solo gap is seen)."""
        if not self._solo:
            return self.config.itl_target_s
        return min(self.config.itl_target_s, self.config.solo_ratio * statistics.median(self._solo))

    def held_target(self, behind: bool) -> float:
        """The target a chunk's gaps are judged against: `target`, or with `drain` the configured cap
        while prefill is behind."""
        return self.config.itl_target_s if self.config.drain and behind else self.target

    def rung_gap(self, rung: int) -> float | None:
        """The gap last measured beside a chunk on `rung`, unless older than STALE_CHUNKS (`knee` only)."""
        measured = self._rung_gaps.get(rung)
        if measured is None or self._chunks - measured[1] > STALE_CHUNKS:
            return None
        return measured[0]

    def _adjust(self, behind: bool) -> None:
        gaps, self._gaps = sorted(self._gaps), []
        if not gaps or self._chunk_rung != self.rung:
            return
        gap = gaps[min(len(gaps) - 1, int(QUANTILE * len(gaps)))]
        target = self.held_target(behind)
        knee = self.config.knee and not behind
        if self.config.knee:
            self._rung_gaps[self.rung] = (gap, self._chunks)
        floor = self.config.lowest_rung
        below = self.rung_gap(self.rung - 1) if knee and self.rung > floor else None
        above = self.rung_gap(self.rung + 1) if knee else None
        if gap > target or (below is not None and gap > STEP * below):
            self.rung = max(floor, self.rung - 1)
        elif gap < self.config.grow_below * target and (above is None or above <= STEP * gap):
            self.rung = min(self.top_beside_decode, self.rung + 1)
        elif knee and self.rung > floor and below is None:
            self.rung -= 1  # the rung below is not known: measure it (a flat curve climbs back)
