"""A two-rank torch.distributed group linking one sender (rank 0) and one receiver (rank 1).

Independent processes cannot share a default process group, so each pair builds a plain
ProcessGroupNCCL / ProcessGroupGloo from a PrefixStore (unique per pair) over the TCPStore the sender
serves on an ephemeral port. Each end runs the pair's blocking work (rendezvous, send, recv) on the
pair's own thread, in FIFO order: NCCL matches point-to-point operations by order, not by tag, so the
i-th send of one end meets the i-th recv of the other. Any error or timeout breaks the pair for good
(its order can no longer be trusted); the owner then starts a new pair.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

Task = Callable[[dist.ProcessGroup], None]
# NCCL's watchdog tears the whole process down when an operation outlives the group timeout; transfers
# enforce their own deadlines (and abort the group), so the watchdog timeout is set out of the way.
NCCL_WATCHDOG_TIMEOUT = timedelta(days=365)


def resolve_backend(dist_backend: str, device: torch.device) -> str:
    if dist_backend != "auto":
        return dist_backend
    return "nccl" if device.type == "cuda" else "gloo"


def serve_store(host: str, timeout_s: float) -> dist.TCPStore:
    """The sender's rendezvous store on an ephemeral port (read it back from `.port`)."""
    return dist.TCPStore(host, 0, None, True, timeout=timedelta(seconds=timeout_s), wait_for_workers=False)


def connect_store(host: str, port: int, timeout_s: float) -> dist.TCPStore:
    """A client of a sender's store; it connects on construction, so call it on a pair's thread."""
    return dist.TCPStore(host, port, None, False, timeout=timedelta(seconds=timeout_s))


def make_group(
    backend: str, store: dist.Store, pair_id: str, rank: int, iface: str, timeout_s: float
) -> dist.ProcessGroup:
    prefixed = dist.PrefixStore(f"kvtransfer/{pair_id}/", store)
    # The backends are c10d Backend objects used directly as the pair's group; torch's stubs call
    # them neither ProcessGroups nor list the gloo options (private API).
    if backend == "gloo":
        opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=iface)]
        opts._timeout = timedelta(seconds=timeout_s)
        return dist.ProcessGroupGloo(prefixed, rank, 2, opts)  # type: ignore[return-value]
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = NCCL_WATCHDOG_TIMEOUT
    return dist.ProcessGroupNCCL(prefixed, rank, 2, opts)  # type: ignore[return-value]


def wait_work(work: dist.Work, backend: str, deadline: float, broken: Callable[[], bool]) -> None:
    """Block until `work` finishes; TimeoutError past `deadline` (monotonic), errors re-raised."""
    if backend == "gloo":
        # Gloo's point-to-point work never reports completion through is_completed(); wait() with a
        # timeout is its only way (a timed-out gloo pair is closed, which the caller treats as broken).
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("transfer deadline passed")
        work.wait(timedelta(seconds=remaining))
        return
    while not work.is_completed():  # a CUDA event query: cheap, and never hangs like a blocking wait
        if time.monotonic() > deadline or broken():
            raise TimeoutError("transfer deadline passed")
        time.sleep(0.0005)
    work.wait()


def close_pairs(pairs: list[PairGroup], reason: str, timeout_s: float = 1.0) -> None:
    """Close pairs and give the threads holding a group a bounded moment to tear it down (a process that
    exits while a gloo group is half destroyed on a daemon thread aborts in C++). Threads still stuck in
    a rendezvous are not waited for: they hold no group yet and end with the store's timeout."""
    for pair in pairs:
        pair.close(reason)
    deadline = time.monotonic() + timeout_s
    for pair in pairs:
        if pair.has_group:
            pair.join(max(0.0, deadline - time.monotonic()))


class PairGroup:
    """One end of a pair, with the thread that owns its group."""

    def __init__(
        self,
        pair_id: str,
        rank: int,
        backend: str,
        make_store: Callable[[], dist.Store],
        iface: str,
        timeout_s: float,
    ) -> None:
        self.pair_id = pair_id
        self.rank = rank
        self.backend = backend
        self._make_store = make_store
        self._iface = iface
        self._timeout_s = timeout_s
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._group: dist.ProcessGroup | None = None
        self.broken: str | None = None
        self.closed = False
        self._thread = threading.Thread(target=self._run, name=f"kv-pair-{pair_id[:8]}-r{rank}", daemon=True)

    def start(self) -> PairGroup:
        self._thread.start()
        return self

    def submit(self, task: Task, on_error: Callable[[str], None]) -> None:
        """Run `task(group)` after every task submitted before it; `on_error(reason)` if it fails or
        the pair is (or becomes) broken."""
        self._tasks.put((task, on_error))

    def is_broken(self) -> bool:
        return self.broken is not None

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def has_group(self) -> bool:
        return self._group is not None

    def close(self, reason: str) -> None:
        """Break the pair: queued tasks fail, a running wait gives up. Never blocks (the pair's thread
        tears the group down itself)."""
        if self.closed:
            return
        self.closed = True
        if self.broken is None:
            self.broken = reason
        self._tasks.put(None)

    def join(self, timeout_s: float) -> None:
        """Wait (bounded) for the thread to finish tearing the group down after `close()`."""
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        try:
            self._group = make_group(
                self.backend, self._make_store(), self.pair_id, self.rank, self._iface, self._timeout_s
            )
        except Exception as e:
            self.broken = self.broken or f"{self.backend} pair rendezvous failed: {e}"
        while True:
            item = self._tasks.get()
            if item is None:
                break
            task, on_error = item
            if self.broken is None:
                try:
                    task(self._group)
                    continue
                except Exception as e:
                    self.broken = self.broken or f"{self.backend} pair failed: {type(e).__name__}: {e}"
            on_error(self.broken)
        self._drain_failed()
        self._teardown()

    def _teardown(self) -> None:
        """Runs on the pair's thread, so a slow teardown (a dead peer) delays no one else."""
        group, self._group = self._group, None
        if group is not None and self.backend == "nccl":
            try:
                group.abort()  # ends any NCCL kernel still waiting for the peer
            except Exception:
                logger.debug("kvtransfer pair %s: abort failed", self.pair_id, exc_info=True)

    def _drain_failed(self) -> None:
        while True:
            try:
                item = self._tasks.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                item[1](self.broken or "pair closed")
