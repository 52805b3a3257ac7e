"""A worker's channels in a process of their own (`--worker-io process`).

Why: the engine loop is host-bound (a decode step of the default model at 256 rows is ~1.8 ms of
Python and launches). In thread mode (`WorkerChannels` in the engine process) the I/O thread that
encodes, sends and receives every message shares the engine's GIL: each of its passes is time the
engine thread waits. Here the same `WorkerChannels` run in a child process (common/worker/io_child.py)
and the engine process only pickles one frame per loop turn onto a socketpair and unpickles the
commands the child has already decoded and checked. The engine process then runs no I/O thread.

`ProcessChannels` offers what the engine side of `WorkerChannels` offers (start, register, to_front,
to_peer, publish, hold/release_wakes, inbox, load, close), so `WorkerService` and the roles use
either. Invariants:
* Order: frames travel in the order they are sent, and the child applies each frame's operations in
  order, so a request's messages keep their order as in thread mode.
* Lifetime: the child lives exactly as long as the pair is open. It ignores SIGINT/SIGTERM (the
  launcher signals the worker, the worker closes the pair); a dead parent is EOF and ends it. A dead
  child makes the next send or receive here raise `ChannelProcessDied`, which ends the worker (the
  launcher restarts it): a worker that can no longer talk to the router must not keep its requests.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import queue
import socket
import subprocess
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

from common.net.curve import CurveKeys
from common.wire.messages import Message, WorkerRegister
from common.worker.channels import EVENTS, FRONT, ROUTER, BoundAddresses
from common.worker.fronts import FrontStatus
from common.worker.role import LoadReport

log = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0  # the child imports zmq and the wire modules, binds and answers: ~0.2 s here
STOP_TIMEOUT_S = 5.0
# The project root, so the child imports this tree whatever the parent's working directory.
_ROOT = str(Path(__file__).resolve().parents[2])


class ChannelProcessDied(RuntimeError):
    """The channel process is gone: the worker can neither hear commands nor send tokens."""


@dataclass(frozen=True)
class ChannelSpec:
    """Parent -> child, the first frame: `WorkerChannels`' arguments, and how the child logs."""

    worker_id: str
    router_addr: str
    host: str
    with_events: bool
    heartbeat_interval_s: float
    register_interval_s: float
    log_level: str
    curve: CurveKeys | None = field(default=None, repr=False)  # over the pair, never on a command line


@dataclass(frozen=True)
class StartFailed:
    """Child -> parent instead of the bound addresses: why the sockets could not be set up."""

    error: str


# Operations in a parent -> child frame (a list of tuples, applied in order).
OP_SEND, OP_REGISTER, OP_LOAD = "send", "register", "load"


class ProcessInbox:
    """The engine side's `inbox`: `get(timeout)` / `get_nowait()` as a `queue.Queue`'s, fed by the
    child's frames (each a list of decoded commands and `FrontStatus`es). Engine thread only."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._items: deque[Message | FrontStatus] = deque()

    def get_nowait(self) -> Message | FrontStatus:
        return self.get(timeout=0.0)

    def get(self, timeout: float = 0.0) -> Message | FrontStatus:
        if not self._items:
            self._read(timeout)
        if not self._items:
            raise queue.Empty
        return self._items.popleft()

    def _read(self, timeout: float) -> None:
        try:
            if not self._conn.poll(timeout):
                return
            while True:  # every frame already here, not only the first
                self._items.extend(pickle.loads(self._conn.recv_bytes()))
                if not self._conn.poll(0):
                    return
        except (EOFError, OSError) as e:
            raise ChannelProcessDied(f"the worker's channel process is gone: {e!r}") from e


class ProcessChannels:
    """The engine process's end of the channel process. Sends from any thread; the inbox is read by
    the engine thread only. No I/O in the constructor."""

    def __init__(self, spec: ChannelSpec) -> None:
        self.spec = spec
        self.inbox: ProcessInbox | None = None
        self._conn: Connection | None = None
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()  # guards `_pending` and writes on the pair
        self._pending: list[tuple] = []
        self._holder: int | None = None
        self._load = LoadReport()

    def start(self) -> BoundAddresses:
        """Start the child, hand it the spec, wait until its sockets are bound."""
        if self._proc is not None:
            raise RuntimeError("ProcessChannels can be started once")
        ours, theirs = socket.socketpair()
        env = dict(
            os.environ, PYTHONPATH=os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")]))
        )
        with theirs:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "common.worker.io_child", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                env=env,
            )
        self._conn = Connection(ours.detach())
        self._conn.send_bytes(pickle.dumps(self.spec))
        reply = self._start_reply()
        self.inbox = ProcessInbox(self._conn)
        return reply

    def _start_reply(self) -> BoundAddresses:
        try:
            if not self._conn.poll(START_TIMEOUT_S):
                raise ChannelProcessDied(f"the channel process did not start within {START_TIMEOUT_S:.0f} s")
            reply = pickle.loads(self._conn.recv_bytes())
        except (EOFError, OSError) as e:
            raise ChannelProcessDied(
                f"the channel process exited at start (status {self._proc.poll()})"
            ) from e
        if isinstance(reply, StartFailed):
            raise ValueError(f"cannot set up the worker's sockets: {reply.error}")
        return reply

    # ---- what WorkerChannels offers the engine side ---------------------------------------------

    def register(self, registration: WorkerRegister) -> None:
        self._put((OP_REGISTER, registration))

    def to_front(self, reply_to: str | None, msg: Message) -> None:
        self._put((OP_SEND, ROUTER if reply_to is None else FRONT + reply_to, msg))

    def to_peer(self, command_addr: str, msg: Message) -> None:
        self._put((OP_SEND, command_addr, msg))

    def publish(self, msg: Message) -> None:
        self._put((OP_SEND, EVENTS, msg))

    @property
    def load(self) -> LoadReport:
        return self._load

    @load.setter
    def load(self, report: LoadReport) -> None:
        self._load = report
        self._put((OP_LOAD, report))

    def hold_wakes(self) -> None:
        """Until `release_wakes()`, this thread's sends collect into one frame (one pickle, one write
        per loop turn). Other threads' sends go at once."""
        self._holder = threading.get_ident()

    def release_wakes(self) -> None:
        self._holder = None
        self._flush()

    def close(self) -> None:
        """Send what is pending, close the pair (the child then closes its sockets) and reap it."""
        if self._proc is None or self._conn is None:
            return
        with contextlib.suppress(ChannelProcessDied):  # closing anyway
            self._flush()
        with self._lock:
            self._conn.close()
        try:
            self._proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.warning("the channel process did not exit: killing it")
            self._proc.kill()
            self._proc.wait()

    # ---- internals ------------------------------------------------------------------------------

    def _put(self, op: tuple) -> None:
        with self._lock:
            self._pending.append(op)
        if self._holder != threading.get_ident():
            self._flush()

    def _flush(self) -> None:
        with self._lock:
            if not self._pending or self._conn is None or self._conn.closed:
                return
            ops, self._pending = self._pending, []
            try:
                self._conn.send_bytes(pickle.dumps(ops, pickle.HIGHEST_PROTOCOL))
            except OSError as e:
                raise ChannelProcessDied(f"the worker's channel process is gone: {e!r}") from e
