"""The launcher's side of a Ray worker: a handle on its supervisor actor, and stopping many at once.

Kept apart from deploy/ray_backend.py, whose supervisor is the actor's side (it runs in the actor
process): these calls run in the launcher and only talk to actors through Ray.
"""

from __future__ import annotations

import logging

import ray
from ray.exceptions import RayError

from deploy.base import WorkerHandle, WorkerSpec

log = logging.getLogger(__name__)

_RPC_MARGIN_S = 5.0  # time for a stop() call to reach the actor and come back, beyond the grace period


class RayWorkerHandle(WorkerHandle):
    """One worker actor. `alive()` is True until the supervisor's `run` has returned or the actor died."""

    def __init__(self, spec: WorkerSpec, actor, run_ref) -> None:
        self.spec = spec
        self._actor = actor
        self._run_ref = run_ref
        self._stopped = False

    def alive(self) -> bool:
        if self._stopped:
            return False
        ready, _ = ray.wait([self._run_ref], timeout=0)  # timeout=0: a local check, never blocks
        return not ready

    def pid(self, timeout_s: float = 30.0) -> int | None:
        return ray.get(self._actor.pid.remote(), timeout=timeout_s)

    def restarts(self, timeout_s: float = 30.0) -> int:
        return ray.get(self._actor.restarts.remote(), timeout=timeout_s)

    def stop(self, grace_s: float = 10.0) -> None:
        stop_all([self], grace_s)


def stop_all(handles: list[RayWorkerHandle], grace_s: float) -> None:
    """Stop several workers at once, so that shutdown takes one grace period, not one per worker."""
    todo = [h for h in handles if not h._stopped]
    for h in todo:
        h._stopped = True
    refs = [h._actor.stop.remote(grace_s) for h in todo]
    if refs:
        ray.wait(refs, num_returns=len(refs), timeout=grace_s + _RPC_MARGIN_S)
    for h, ref in zip(todo, refs, strict=True):
        try:
            ray.get(ref, timeout=0)
        except RayError as e:  # dead already, or hung: ray.kill below, and the deathsig takes the child
            log.warning("worker %s did not stop cleanly: %s", h.spec.worker_id, type(e).__name__)
        ray.kill(h._actor, no_restart=True)
