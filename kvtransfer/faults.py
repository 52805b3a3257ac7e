"""Injected KV-transfer faults, for soak tests and benchmarks only (off unless the variable is set).

`PDSERVE_KV_FAULTS="drop=0.05,delay=0.1,delay_s=3,seed=7"` in a decode (or mixed) worker's environment
wraps its `KVReceiverSet` so that, per request (decided by a hash of the seed and the request id, so a
run is reproducible whatever the arrival order):

* `drop` (probability): the fetch is never started, as if every frame of it were lost; the transfer is
  reported FAILED `delay_s` later (standing in for the fetch timeout). The sender never hears from the
  receiver, so its publication stays pinned until its lease ends: the lease path is exercised too.
* `delay` (probability): the fetch starts `delay_s` late, as if the network stalled; a delay beyond the
  sender's lease ends in a refused fetch (FAILED) and the recompute path.

The variable is read once, when the worker opens its KV side (`receiver_set`); every injected fault is
logged at warning level (`injected KV fault: drop|delay REQUEST_ID`), which is how benchmarks/chaos.py
counts them. The faults sit in front of the transport, so tcp, ipc and nccl are all covered.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

import torch

from common.wire.handoff import HandOff

from .base import TransferResult, TransferStatus
from .config import KVTransferConfig
from .peers import KVReceiverSet

log = logging.getLogger(__name__)
KV_FAULTS_ENV = "PDSERVE_KV_FAULTS"
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

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> KVFaults | None:
        text = environ.get(KV_FAULTS_ENV, "").strip()
        return cls.parse(text) if text else None

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
    handoff: HandOff
    dst: list[int]
    block_hashes: list[int] | None  # the prompt's chain the transfer is checked against


class FaultyReceiverSet(KVReceiverSet):
    """A KVReceiverSet that drops or delays some fetches (see the module docstring)."""

    def __init__(self, kv_cache: torch.Tensor, config: KVTransferConfig, faults: KVFaults) -> None:
        super().__init__(kv_cache, config)
        self.faults = faults
        self._held: list[_Held] = []

    def fetch(
        self, handoff: HandOff, dst: list[int], block_hashes: Sequence[int] | None = None
    ) -> str | None:
        kind = self.faults.choose(handoff.request_id)
        if kind is None:
            return super().fetch(handoff, dst, block_hashes)
        log.warning("injected KV fault: %s %s", kind, handoff.request_id)
        due = time.monotonic() + self.faults.delay_s
        hashes = list(block_hashes) if block_hashes is not None else None
        self._held.append(_Held(due, kind, handoff, list(dst), hashes))
        return None

    def poll(self) -> list[TransferResult]:
        results = super().poll()
        now = time.monotonic()
        due = [h for h in self._held if h.due <= now]
        self._held = [h for h in self._held if h.due > now]
        for held in due:
            error = "injected fault: transfer dropped" if held.kind == "drop" else None
            if error is None:  # a late start; its outcome comes from the transport like any other
                error = super().fetch(held.handoff, held.dst, held.block_hashes)
            if error is not None:
                results.append(TransferResult(held.handoff.request_id, TransferStatus.FAILED, error=error))
        return results


def receiver_set(
    kv_cache: torch.Tensor, config: KVTransferConfig, environ: Mapping[str, str] = os.environ
) -> KVReceiverSet:
    """The decode side's receivers, with injected faults when `PDSERVE_KV_FAULTS` asks for them."""
    faults = KVFaults.from_env(environ)
    if faults is None:
        return KVReceiverSet(kv_cache, config)
    log.warning("KV fault injection is ON (%s=%s): for tests only", KV_FAULTS_ENV, faults.to_env())
    return FaultyReceiverSet(kv_cache, config, faults)
