"""/metrics summed over several router fronts.

A Prometheus server scraping the one port the fronts share (deploy.launch --api-servers N) reaches
whichever front the kernel gives the connection to, so each front's /metrics answers for the cluster:
every front publishes a snapshot of the figures it counts for the requests it owns (requests, tokens,
latency histograms, requests running, ...; RouterMetrics.front_owned) to `metrics-{front}.json` in the
directory the launcher shares (--fronts-dir), every PUBLISH_INTERVAL_S and on each scrape of its own,
and a scrape sums its own fresh figures with the other fronts' latest snapshots: counters and histogram
buckets add up, gauges too (the requests running on all fronts). The gauges that describe the workers
(RouterMetrics.worker_views) are the answering front's own: each front holds a replica of the same
picture, so summing them would count every worker N times. `pdserve_router_fronts` says how many fronts
the sum covers.

A front that restarts carries on from its predecessor's last snapshot (its counters and histograms; not
its gauges: its requests died with it), so the summed counters never drop: Prometheus would take a
drop of the sum for a reset and count everything the other fronts ever counted as new. What the old
process counted after its last publish (under PUBLISH_INTERVAL_S) is lost, as nobody saw it anyway.

Costs and limits: the other fronts' figures are up to PUBLISH_INTERVAL_S old. A snapshot that cannot be
read or does not fit (another version's metric set) is left out of the sum, with a warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from pathlib import Path

from router.front_slots import check_front_place
from router.metrics import Snapshot
from router.router_metrics import RouterMetrics

log = logging.getLogger(__name__)
PUBLISH_INTERVAL_S = 1.0
SNAPSHOT_PREFIX = "metrics-"


def snapshot_path(directory: str, front: int) -> Path:
    return Path(directory) / f"{SNAPSHOT_PREFIX}{front}.json"


class FrontMetrics:
    """Front `front`'s share of the fronts' metrics in `directory`; `start` begins publishing."""

    def __init__(self, directory: str, front: int, metrics: RouterMetrics) -> None:
        check_front_place(directory, front)
        self.directory = directory
        self.front = front
        self.metrics = metrics
        self._task: asyncio.Task | None = None
        self._carried: Snapshot = {}  # the predecessor's totals (a restarted front's)

    def start(self) -> None:
        self._carry_over()
        self.publish()
        self._task = asyncio.get_running_loop().create_task(self._publish_forever())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.publish()  # the last figures stay in the sum the other fronts show

    def own(self) -> Snapshot:
        """This front's figures (plus its predecessor's totals) as the other fronts sum them."""
        names = self.metrics.front_owned
        mine = self.metrics.registry.snapshot(names)
        if not self._carried:
            return mine
        return self.metrics.registry.summed([self._carried, mine], names).snapshot(names)

    def publish(self) -> Snapshot:
        """Write `own()` for the other fronts; returns it."""
        snapshot = self.own()
        path = snapshot_path(self.directory, self.front)
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(snapshot), encoding="utf-8")
        os.replace(tmp, path)  # a reader never sees a half-written snapshot
        return snapshot

    def render(self) -> str:
        """The exposition text: the front-owned metrics summed over every front's snapshot."""
        snapshots = [self.publish(), *self._others()]
        self.metrics.fronts.set(len(snapshots))
        return self.metrics.registry.summed(snapshots, self.metrics.front_owned).render()

    def _others(self) -> list[Snapshot]:
        mine = snapshot_path(self.directory, self.front).name
        found = []
        for path in sorted(Path(self.directory).glob(f"{SNAPSHOT_PREFIX}*.json")):
            if path.name != mine:
                snapshot = self._load(path)
                if snapshot is not None:
                    found.append(snapshot)
        return found

    def _load(self, path: Path) -> Snapshot | None:
        try:
            snapshot = json.loads(path.read_text(encoding="utf-8"))
            self.metrics.registry.summed([snapshot], self.metrics.front_owned)  # does it fit?
            return snapshot
        except (OSError, ValueError, TypeError, AttributeError) as e:
            log.warning("left %s out of /metrics: %s", path, e)
            return None

    def _carry_over(self) -> None:
        path = snapshot_path(self.directory, self.front)
        old = self._load(path) if path.exists() else None
        if old is not None:
            self._carried = {k: v for k, v in old.items() if k in self.metrics.cumulative}

    async def _publish_forever(self) -> None:
        while True:
            await asyncio.sleep(PUBLISH_INTERVAL_S)
            try:
                self.publish()
            except OSError as e:  # a full disk must not end the loop: the next turn tries again
                log.warning("could not publish this front's metrics: %s", e)
