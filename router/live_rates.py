"""The figures the disaggregation cost model runs on, learned from what the router observes.

- Prefill rate per worker (prompt tokens/s): from a stage timing when the worker reports one
  (`TokenOutput.timings["prefill"]`: new tokens / seconds); otherwise from the time between dispatch
  and the first token, over the tokens the worker had to compute by then (those queued ahead of the
  request plus its own uncached tokens). The second is a lower bound on the real rate (it includes
  the network and the scheduler), which errs towards counting a queue as slow.
- KV transfer bandwidth per (prefill, decode) pair and the KV bytes per prompt token (a model
  property): from `kv_transfer_bytes` / `kv_transfer_seconds` of the decode side's TokenOutputs.
- Decode admission delay per decode worker: from `timings["decode_admission"]`.
- A pair's probe transfer (router/kv_probes.py) stands in for its bandwidth until real transfers
  between the two have been measured.

Each figure is an exponentially weighted mean of its samples; before the first sample a prior is
used (`PRIORS`), and a pair never measured uses the mean over measured pairs. Owned by the router's
single event loop: no locks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

EWMA_ALPHA = 0.2  # weight of a new sample: ~5 recent requests dominate, one outlier does not


@dataclass(frozen=True)
class Priors:
    prefill_tokens_per_s: float = 8192.0  # a small model on one GPU prefills faster; a CPU much slower
    transfer_bytes_per_s: float = 2e9  # between tcp over a NIC and ipc on one host
    kv_bytes_per_token: float = 128 * 1024  # an 8B-class model in bf16 (36 layers x 8 KV heads x 128 x 2 x 2)
    decode_admission_s: float = 0.005


PRIORS = Priors()


@dataclass
class Ewma:
    value: float
    samples: int = 0

    def update(self, sample: float) -> None:
        self.value = sample if self.samples == 0 else self.value + EWMA_ALPHA * (sample - self.value)
        self.samples += 1


@dataclass
class LiveRates:
    priors: Priors = PRIORS
    _prefill: dict[str, Ewma] = field(default_factory=dict)
    _bandwidth: dict[tuple[str, str], Ewma] = field(default_factory=dict)
    _probed: dict[tuple[str, str], float] = field(default_factory=dict)  # bytes/s of each pair's probe
    _admission: dict[str, Ewma] = field(default_factory=dict)
    _kv_bytes_per_token: Ewma | None = None

    # ---- observations ------------------------------------------------------------------------

    def observe_first_token(self, worker_id: str, tokens_computed: int, seconds: float) -> None:
        """A prefill finished without a reported timing: `tokens_computed` (queued ahead + its own
        uncached tokens) in `seconds` between dispatch and the first token."""
        if tokens_computed > 0 and seconds > 0:
            _update(self._prefill, worker_id, tokens_computed / seconds, self.priors.prefill_tokens_per_s)

    def observe_prefill(self, worker_id: str, new_tokens: int, prefill_s: float) -> None:
        """The worker reported how long the prompt's own compute took (`timings["prefill"]`)."""
        if new_tokens > 0 and prefill_s > 0:
            _update(self._prefill, worker_id, new_tokens / prefill_s, self.priors.prefill_tokens_per_s)

    def observe_transfer(
        self, prefill_id: str, decode_id: str, num_bytes: int, seconds: float, prompt_tokens: int
    ) -> None:
        if num_bytes <= 0 or seconds <= 0:
            return
        _update(
            self._bandwidth, (prefill_id, decode_id), num_bytes / seconds, self.priors.transfer_bytes_per_s
        )
        if prompt_tokens > 0:
            if self._kv_bytes_per_token is None:
                self._kv_bytes_per_token = Ewma(self.priors.kv_bytes_per_token)
            self._kv_bytes_per_token.update(num_bytes / prompt_tokens)

    def observe_probe(self, prefill_id: str, decode_id: str, bytes_per_s: float) -> None:
        """A probe transfer between the pair ran at `bytes_per_s` (0: it failed)."""
        if bytes_per_s >= 0 and math.isfinite(bytes_per_s):
            self._probed[(prefill_id, decode_id)] = bytes_per_s

    def observe_admission(self, decode_id: str, seconds: float) -> None:
        if seconds >= 0 and math.isfinite(seconds):
            _update(self._admission, decode_id, seconds, self.priors.decode_admission_s)

    # ---- figures -----------------------------------------------------------------------------

    def prefill_tokens_per_s(self, worker_id: str) -> float:
        return _value(self._prefill.get(worker_id), self.priors.prefill_tokens_per_s)

    def transfer_bytes_per_s(self, prefill_id: str, decode_id: str) -> float:
        pair = self._bandwidth.get((prefill_id, decode_id))
        if pair is not None:
            return pair.value
        if self._probed.get((prefill_id, decode_id), 0) > 0:  # measured by its probe only
            return self._probed[(prefill_id, decode_id)]
        if self._bandwidth:  # an unmeasured pair: the cluster's typical link
            return sum(e.value for e in self._bandwidth.values()) / len(self._bandwidth)
        return self.priors.transfer_bytes_per_s

    @property
    def kv_bytes_per_token(self) -> float:
        return _value(self._kv_bytes_per_token, self.priors.kv_bytes_per_token)

    def decode_admission_s(self, decode_id: str) -> float:
        return _value(self._admission.get(decode_id), self.priors.decode_admission_s)

    def snapshot(self) -> dict:
        """What /debug/index shows: every learned figure with its sample count, and the priors."""
        return {
            "prefill_tokens_per_s": {w: _view(e) for w, e in sorted(self._prefill.items())},
            "transfer_bytes_per_s": {f"{p}->{d}": _view(e) for (p, d), e in sorted(self._bandwidth.items())},
            "probed_bytes_per_s": {f"{p}->{d}": round(v, 1) for (p, d), v in sorted(self._probed.items())},
            "kv_bytes_per_token": _view(self._kv_bytes_per_token) if self._kv_bytes_per_token else None,
            "decode_admission_s": {w: _view(e) for w, e in sorted(self._admission.items())},
            "priors": vars(self.priors),
        }


def _update(table: dict, key, sample: float, prior: float) -> None:
    if math.isfinite(sample):
        table.setdefault(key, Ewma(prior)).update(sample)


def _value(e: Ewma | None, prior: float) -> float:
    return prior if e is None or e.samples == 0 else e.value


def _view(e: Ewma) -> dict:
    return {"value": round(e.value, 6), "samples": e.samples}
