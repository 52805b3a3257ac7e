"""One attempt at a sequence (its dispatch to one route), and the rules for retrying a failed one.

Kept apart from router/request_lifecycle.py, which runs the attempts: what an attempt holds, the
failure that sends it elsewhere, and whether tokens already sent survive a retry are one concern.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.wire.sampling_params import SamplingParams
from router.errors import APIError
from router.request_stream import RequestStream
from router.route_planner import RETRY_AFTER, Route


@dataclass(frozen=True)
class Dispatch:
    """One attempt; its wire id is fresh per retry, so a failed attempt's stray messages never mix in."""

    wire_id: str
    route: Route
    stream: RequestStream
    sent_at: float

    @property
    def workers(self) -> tuple[str, ...]:
        r = self.route
        return (r.decode_id,) if r.local else (r.prefill_id, r.decode_id)


class RetryElsewhere(Exception):
    """A failure that other workers may not have: the next attempt's route leaves `worker_id` out."""

    def __init__(self, worker_id: str, reason: str) -> None:
        super().__init__(reason)
        self.worker_id = worker_id


def replayable(sampling: SamplingParams) -> bool:
    """Whether a retry regenerates the same tokens: greedy, or seeded (each worker seeds afresh)."""
    return sampling.greedy or sampling.seed is not None


def worker_failed(reason: str) -> APIError:
    return APIError(503, f"worker failed mid-generation: {reason}", code="worker_failed", headers=RETRY_AFTER)
