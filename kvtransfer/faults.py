"""Injected KV-transfer faults, for soak tests and benchmarks only (off unless the variable is set).

`PDSERVE_KV_FAULTS="drop=0.05,delay=0.1,delay_s=3,seed=7"` in a worker's environment wraps every KV
receiver it creates (the registry's wrapper "faults", `registry.py`; a sender is left alone) so that,
per request (decided by a hash of the seed and the request id, so a run is reproducible whatever the
arrival order):

* `drop` (probability): the fetch is never started, as if every frame of it were lost; the transfer is
  reported FAILED `delay_s` later (standing in for the fetch timeout). The sender never hears from the
  receiver, so its publication stays pinned until its lease ends: the lease path is exercised too.
* `delay` (probability): the fetch starts `delay_s` late, as if the network stalled; a delay beyond the
  sender's lease ends in a refused fetch (FAILED) and the recompute path.

The variable is read when a receiver is created (when the worker opens its KV side); every injected
fault is logged at warning level (`injected KV fault: drop|delay REQUEST_ID`), which is how
benchmarks/chaos/chaos.py counts them. The wrapper sits in front of each transport's receiver, so tcp,
ipc and nccl are all covered. Nothing in the product imports this module: the registry loads it by
name, and only while the variable is set.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, fields
from typing import Any

from .base import KVReceiver, TransferResult, TransferStatus
from .registry import KV_FAULTS_ENV

log = logging.getLogger(__name__)
FAULT_KINDS = ("drop", "delay")


@dataclass(frozen=True)
class KVFaults:
    drop: float = 0.0  # probability that a request's fetch is dropped
    delay: float = 0.0  # probability that it is delayed
    delay_s: float = 2.0  # how late a delayed fetch starts, and when a dropped one is reported FAILED
    seed: int = 0

    def __post_init__(self) -> None:
        for name in FAULT_KINDS:
            value = getattr(self, name)
            if not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {value!r}")
        if self.drop + self.delay > 1.0:
            raise ValueError(f"drop + delay must be at most 1, got {self.drop + self.delay}")
        if not isinstance(self.delay_s, int | float) or not 0.0 < self.delay_s < 3600.0:
            raise ValueError(f"delay_s must be in (0, 3600) seconds, got {self.delay_s!r}")
        if type(self.seed) is not int:
            raise ValueError(f"seed must be an int, got {self.seed!r}")

    @classmethod
    def parse(cls, text: str) -> KVFaults:
        """From `key=value,...` (keys: drop, delay, delay_s, seed); ValueError naming a bad key."""
        types = {f.name: (int if f.name == "seed" else float) for f in fields(cls)}
        values: dict[str, float | int] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, sep, raw = item.partition("=")
            key = key.strip()
            if not sep or key not in types:
                raise ValueError(
                    f"{KV_FAULTS_ENV}: expected one of {sorted(types)} as key=value, got {item!r}"
                )
            try:
                values[key] = types[key](raw.strip())
            except ValueError:
                raise ValueError(f"{KV_FAULTS_ENV}: {key} must be a number, got {raw!r}") from None
        return cls(**values)  # type: ignore[arg-type]

    def to_env(self) -> str:
        return f"drop={self.drop},delay={self.delay},delay_s={self.delay_s},seed={self.seed}"

    def choose(self, request_id: str) -> str | None:
        """The fault for this request ("drop", "delay") or None; the same answer for the same id."""
        draw = random.Random(f"{self.seed}:{request_id}").random()
        if draw < self.drop:
            return "drop"
        return "delay" if draw < self.drop + self.delay else None


@dataclass(frozen=True)
class _Held:
    due: float  # monotonic
    kind: str
    request_id: str
    args: tuple  # the fetch's own arguments, to start it late
    kwargs: dict[str, Any]


class FaultyReceiver:
    """A KV receiver that drops or delays the fetches its faults pick (see the module docstring).

    It knows only that `fetch`'s first argument is the request id or a record carrying `request_id`,
    and that `poll` returns TransferResults; every other method and attribute is the wrapped
    receiver's, so it wraps any transport whatever else their interface holds."""

    def __init__(self, inner: KVReceiver, faults: KVFaults) -> None:
        self.inner = inner
        self.faults = faults
        self._held: list[_Held] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def fetch(self, *args: Any, **kwargs: Any) -> Any:
        request_id = _request_id(args, kwargs)
        kind = self.faults.choose(request_id)
        if kind is None:
            return self.inner.fetch(*args, **kwargs)
        log.warning("injected KV fault: %s %s", kind, request_id)
        copied = tuple(list(a) if isinstance(a, list) else a for a in args)  # the caller may reuse its lists
        self._held.append(_Held(time.monotonic() + self.faults.delay_s, kind, request_id, copied, kwargs))
        return None

    def poll(self) -> list[TransferResult]:
        results = self.inner.poll()
        now = time.monotonic()
        due = [h for h in self._held if h.due <= now]
        self._held = [h for h in self._held if h.due > now]
        for held in due:
            error = "injected fault: transfer dropped" if held.kind == "drop" else self._start_late(held)
            if error is not None:
                results.append(TransferResult(held.request_id, TransferStatus.FAILED, error=error))
        return results

    def _start_late(self, held: _Held) -> str | None:
        # From here the transport reports the outcome like any other; a refusal now is a FAILED result.
        try:
            self.inner.fetch(*held.args, **held.kwargs)
        except (ValueError, RuntimeError) as e:
            return str(e)
        return None


def _request_id(args: tuple, kwargs: dict[str, Any]) -> str:
    first = args[0] if args else next(iter(kwargs.values()))
    return str(getattr(first, "request_id", first))


def wrap_receiver(receiver: KVReceiver, setting: str) -> FaultyReceiver:
    """The registry's "faults" wrapper: `receiver` behind the faults `setting` (PDSERVE_KV_FAULTS's value)."""
    faults = KVFaults.parse(setting)
    log.warning("KV fault injection is ON (%s=%s): for tests only", KV_FAULTS_ENV, faults.to_env())
    return FaultyReceiver(receiver, faults)
