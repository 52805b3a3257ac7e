"""Where one sequence goes: a prefill worker + decode target (remote), or one worker alone (local).

The planner gathers the candidates the `--disagg` mode allows (router/disagg.py), lets the routing
policy pick the best of each kind (router/policy.py), feeds both to the pure `decide` with the live
figures (router/live_rates.py), and returns a `Route`. It sends nothing and changes no state.
Degraded KV pairs (router/kv_probes.py) are avoided: the decode target of a remote route is chosen
among those whose pair with the chosen prefill worker is not degraded, when there is one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from common.wire.blocks import blocks_for
from common.wire.hashing import block_hashes, salt_root
from common.wire.sampling_params import SamplingParams
from router.disagg import LOCAL, REMOTE, Decision, DisaggInputs, LocalOption, RemoteOption, decide
from router.errors import APIError
from router.kv_probes import KVProbes
from router.live_rates import LiveRates
from router.policy import Choice, DecodeLoad, PrefillLoad, RoutingPolicy, new_prefill_tokens
from router.prefix_index import PrefixIndex
from router.worker_registry import WorkerRegistry

# A 503 here means "the cluster cannot take this right now": a client that backs off briefly will
# usually succeed, so say so, as for a 429.
RETRY_AFTER = {"Retry-After": "1"}


class Route(NamedTuple):
    decision: Decision
    prefill_id: str  # the worker that computes the prompt (== decode_id for a local route)
    decode_id: str
    new_tokens: int  # prompt tokens the prefilling worker does not hold cached (at least 1)
    queued_tokens: int  # prompt tokens already waiting on the prefilling worker
    prompt_tokens: int
    prompt_blocks: int

    @property
    def local(self) -> bool:
        return self.decision.kind == LOCAL


class _Pick(NamedTuple):
    prefill: Choice
    queued_tokens: int
    decode: DecodeLoad


class RoutePlanner:
    def __init__(
        self,
        registry: WorkerRegistry,
        index: PrefixIndex,
        policy: RoutingPolicy,
        rates: LiveRates,
        stall_weight: float,
        probes: KVProbes | None = None,
    ) -> None:
        self.registry = registry
        self.index = index
        self.policy = policy
        self.rates = rates
        self.stall_weight = stall_weight
        self.probes = probes or KVProbes(num_bytes=0)

    def plan(self, prompt: Sequence[int], sampling: SamplingParams, excluded: set[str]) -> Route:
        """The route for one sequence, or an APIError 503 when no worker can take it. Its prefix is
        looked up under its cache salt's chain (the chain the workers cache its blocks under)."""
        block_size = self.registry.block_size
        if block_size is None:
            raise APIError(503, "no live workers", code="no_workers", headers=RETRY_AFTER)
        matches = self.index.match(block_hashes(prompt, block_size, salt_root(sampling.cache_salt)))
        num_tokens = len(prompt) + sampling.max_tokens
        prefills, targets, locals_ = self.registry.routing_loads(excluded, self.index.num_blocks)
        remote = self._remote(prefills, targets, matches, len(prompt), num_tokens, block_size)
        local = self._local(locals_, matches, len(prompt), num_tokens, block_size)
        decision = decide(
            DisaggInputs(
                self.registry.disagg,
                self._remote_option(remote, len(prompt), block_size),
                self._local_option(local, len(prompt), block_size),
            )
        )
        if decision is None:
            if (prefills and targets) or locals_:
                raise APIError(
                    503, "no worker can hold this request", code="no_capacity", headers=RETRY_AFTER
                )
            raise APIError(503, "no live workers can serve requests", code="no_workers", headers=RETRY_AFTER)
        pick = remote if decision.kind == REMOTE else local
        assert pick is not None  # decide() only picks an option that exists
        return Route(
            decision,
            pick.prefill.worker_id,
            pick.decode.worker_id,
            new_prefill_tokens(len(prompt), pick.prefill.cached_blocks, block_size),
            pick.queued_tokens,
            len(prompt),
            blocks_for(len(prompt), block_size),
        )

    def _remote(
        self,
        prefills: list[PrefillLoad],
        targets: list[DecodeLoad],
        matches: dict[str, int],
        prompt_len: int,
        num_tokens: int,
        block_size: int,
    ) -> _Pick | None:
        if not prefills or not targets:
            return None
        prefill = self.policy.pick_prefill(prefills, matches, prompt_len, block_size)
        if prefill is None:
            return None
        sound = [t for t in targets if not self.probes.degraded(prefill.worker_id, t.worker_id)]
        decode = self.policy.pick_decode(sound, num_tokens) if sound else None
        decode = decode or self.policy.pick_decode(targets, num_tokens)  # a degraded pair beats none
        if decode is None:
            return None
        queued = next(p.queued_prefill_tokens for p in prefills if p.worker_id == prefill.worker_id)
        return _Pick(prefill, queued, next(t for t in targets if t.worker_id == decode.worker_id))

    def _local(
        self,
        candidates: list[DecodeLoad],
        matches: dict[str, int],
        prompt_len: int,
        num_tokens: int,
        block_size: int,
    ) -> _Pick | None:
        choice = self.policy.pick_local(candidates, matches, prompt_len, block_size, num_tokens)
        if choice is None:
            return None
        load = next(c for c in candidates if c.worker_id == choice.worker_id)
        return _Pick(choice, load.queued_prefill_tokens, load)

    def _remote_option(self, pick: _Pick | None, prompt_len: int, block_size: int) -> RemoteOption | None:
        if pick is None:
            return None
        p, d, r = pick.prefill.worker_id, pick.decode.worker_id, self.rates
        return RemoteOption(
            queued_tokens=pick.queued_tokens,
            new_tokens=new_prefill_tokens(prompt_len, pick.prefill.cached_blocks, block_size),
            prompt_tokens=prompt_len,
            prefill_tokens_per_s=r.prefill_tokens_per_s(p),
            kv_bytes_per_token=r.kv_bytes_per_token,
            transfer_bytes_per_s=r.transfer_bytes_per_s(p, d),
            decode_admission_s=r.decode_admission_s(d),
            degraded=self.probes.degraded(p, d),
        )

    def _local_option(self, pick: _Pick | None, prompt_len: int, block_size: int) -> LocalOption | None:
        if pick is None:
            return None
        return LocalOption(
            queued_tokens=pick.queued_tokens,
            new_tokens=new_prefill_tokens(prompt_len, pick.prefill.cached_blocks, block_size),
            prefill_tokens_per_s=self.rates.prefill_tokens_per_s(pick.decode.worker_id),
            num_running=pick.decode.num_running,
            stall_weight=self.stall_weight,
        )
