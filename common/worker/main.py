"""The entry point both worker CLIs share: parse, start, serve until SIGTERM / SIGINT / Shutdown."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Mapping, Sequence

from common.net.gc_heap import GcPauseMeter, freeze_startup_heap
from common.wire import request_log
from common.worker.config import parse_worker_args
from common.worker.role import WorkerRole
from common.worker.service import WorkerService

log = logging.getLogger(__name__)


def run_worker(roles: Mapping[str, Callable[[], WorkerRole]], argv: Sequence[str] | None = None) -> int:
    """Run one worker in this process, in the role `--role` picks from `roles` (role name -> factory;
    the first is the default); returns the exit status (0 after a clean shutdown)."""
    config, log_level = parse_worker_args(argv, list(roles))
    role = roles[config.role]()
    request_log.configure(log_level, config.worker_id)
    service = WorkerService(config, role)
    _install_signal_handlers(service)
    try:
        service.start()
    except ValueError as e:  # a configuration the engine or transport cannot run
        log.error("cannot start: %s", e)
        service.close()
        return 2
    if service.stopping:  # a signal arrived while the model was loading
        service.close()
        return 0
    _quiet_gc(service)
    service.run()
    log.info("worker %s stopped", config.worker_id)
    return 0


def _quiet_gc(service: WorkerService) -> None:
    """Freeze what start-up left alive (the model, the graphs, the imported modules) out of the
    collector's scans, and count the collections that still run in the stats line."""
    frozen = freeze_startup_heap()
    log.info("%d start-up objects frozen out of the garbage collector's scans", frozen)
    meter = GcPauseMeter()
    meter.install()
    service.stats.gc_meter = meter


def _install_signal_handlers(service: WorkerService) -> None:
    """SIGTERM/SIGINT end the loop cleanly. Only the main thread may install handlers; inside a Ray
    actor (another thread) the actor's own lifecycle stops the worker instead."""
    if threading.current_thread() is not threading.main_thread():
        return

    def on_signal(signum: int, _frame) -> None:
        log.info("received %s: shutting down", signal.Signals(signum).name)
        service.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
