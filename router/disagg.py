"""Conditional disaggregation: whether one request prefills on a prefill worker or where it decodes.

Two ways to serve a request:
- remote: a prefill worker computes the prompt (PrefillRequest), its KV moves to a decode target
  (a decode or mixed worker), which decodes;
- local: a decode or mixed worker gets a GenerateRequest and prefills the prompt itself.

`--disagg` modes (the router's flag):
- `always` (the default): remote whenever a live prefill worker and a decode target exist; otherwise
  mixed workers serve whole requests locally. This is today's behaviour for a prefill/decode
  cluster and the only sensible one for a cluster of mixed workers alone; decode workers never
  prefill in this mode.
- `never`: every request is local, on a decode or a mixed worker (prefill workers stay idle).
- `auto`: per request, the cheaper of the two by `estimate_remote` / `estimate_local` (when only
  one is possible, that one).

The cost model compares seconds. Remote: the prefill worker's queue and the prompt's uncached tokens
at its measured prefill rate, plus moving the prompt's KV bytes at the pair's measured bandwidth,
plus the decode side's admission delay. Local: the local worker's queue and uncached tokens at its
rate, plus `stall_weight` x (running sequences) x (this prompt's prefill time): every sequence
decoding there waits while the prompt is computed in the same steps, and that latency is paid by
other users. Under `auto`, a remote option over a degraded pair (its probe failed or ran below
`--kv-probe-min-gbps`, router/kv_probes.py) loses to any local one. Pure functions over small
dataclasses; the live figures come from `router/live_rates.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

DISAGG_MODES = ("always", "never", "auto")
DEFAULT_DISAGG = "always"
DEFAULT_STALL_WEIGHT = 1.0
REMOTE, LOCAL = "remote", "local"
# Workers a remote prefill can hand its KV to (a mixed worker is a decode worker that can also prefill).
DECODE_TARGET_ROLES = ("decode", "mixed")


def check_mode(mode: str) -> str:
    if mode not in DISAGG_MODES:
        raise ValueError(f"disagg must be one of {DISAGG_MODES}, got {mode!r}")
    return mode


def remote_allowed(mode: str) -> bool:
    return check_mode(mode) != "never"


def local_roles(mode: str) -> tuple[str, ...]:
    """The roles that may prefill a request themselves (get a GenerateRequest) in this mode."""
    return ("mixed",) if check_mode(mode) == "always" else ("decode", "mixed")


@dataclass(frozen=True)
class RemoteOption:
    """A prefill worker and a decode target, as the cost model needs them."""

    queued_tokens: int  # prompt tokens already waiting on the prefill worker
    new_tokens: int  # this prompt's tokens the prefill worker does not hold cached
    prompt_tokens: int  # the whole prompt: its KV moves to the decode side
    prefill_tokens_per_s: float
    kv_bytes_per_token: float
    transfer_bytes_per_s: float
    decode_admission_s: float
    degraded: bool = False  # the pair's probe failed or ran below the floor (router/kv_probes.py)


@dataclass(frozen=True)
class LocalOption:
    """A decode or mixed worker that would prefill the prompt itself."""

    queued_tokens: int
    new_tokens: int
    prefill_tokens_per_s: float
    num_running: int  # sequences decoding there now, each stalled by the prefill
    stall_weight: float = DEFAULT_STALL_WEIGHT


@dataclass(frozen=True)
class DisaggInputs:
    mode: str
    remote: RemoteOption | None  # None: no prefill worker / decode target pair available
    local: LocalOption | None  # None: no worker may prefill locally

    def __post_init__(self) -> None:
        check_mode(self.mode)


class Decision(NamedTuple):
    kind: str  # REMOTE or LOCAL
    remote_s: float | None  # estimated cost of each option (None: not available or not estimated)
    local_s: float | None


def estimate_remote(o: RemoteOption) -> float:
    """Seconds to the first decode step of a remote prefill."""
    prefill = (o.queued_tokens + o.new_tokens) / _positive(o.prefill_tokens_per_s, "prefill_tokens_per_s")
    transfer = (
        o.prompt_tokens * o.kv_bytes_per_token / _positive(o.transfer_bytes_per_s, "transfer_bytes_per_s")
    )
    return prefill + transfer + o.decode_admission_s


def estimate_local(o: LocalOption) -> float:
    """Seconds to this request's first token plus the latency it adds to the sequences decoding there."""
    rate = _positive(o.prefill_tokens_per_s, "prefill_tokens_per_s")
    own = o.new_tokens / rate
    return (o.queued_tokens / rate) + own + o.stall_weight * o.num_running * own


def decide(inputs: DisaggInputs) -> Decision | None:
    """Remote or local for one request; None when neither option exists."""
    remote, local = inputs.remote, inputs.local
    if inputs.mode == "never":
        remote = None
    if remote is None or local is None:
        if remote is None and local is None:
            return None
        return Decision(REMOTE, None, None) if remote is not None else Decision(LOCAL, None, None)
    if inputs.mode == "always":
        return Decision(REMOTE, None, None)
    remote_s, local_s = estimate_remote(remote), estimate_local(local)
    if remote.degraded:  # a KV path that failed or ran below the floor is not trusted to keep its estimate
        return Decision(LOCAL, remote_s, local_s)
    # Ties go remote: that keeps the decode batch undisturbed.
    return Decision(LOCAL if local_s < remote_s else REMOTE, remote_s, local_s)


def _positive(value: float, name: str) -> float:
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return value
