"""The channel process of a worker run with `--worker-io process` (see common/worker/io_process.py).

`python -m common.worker.io_child FD`: FD is this end of the socketpair. The main thread applies the
parent's frames to a `WorkerChannels` (whose own I/O thread owns the ZMQ sockets, as in thread mode);
a forwarder thread sends the channels' inbox (decoded commands, front link changes) to the parent, a
batch per frame. Imports no torch.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import sys
import threading
from multiprocessing.connection import Connection

from common.wire import request_log
from common.worker.channels import WorkerChannels
from common.worker.io_process import OP_LOAD, OP_REGISTER, OP_SEND, ChannelSpec, StartFailed

log = logging.getLogger(__name__)


def main(argv: list[str]) -> int:
    # The launcher's signals are for the worker; this process ends when the worker closes the pair.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    conn = Connection(int(argv[0]))
    spec: ChannelSpec = pickle.loads(conn.recv_bytes())
    request_log.configure(spec.log_level, f"{spec.worker_id}-io")
    channels = WorkerChannels(
        spec.worker_id,
        spec.router_addr,
        spec.host,
        spec.with_events,
        spec.heartbeat_interval_s,
        spec.register_interval_s,
        spec.curve,
    )
    try:
        bound = channels.start()
    except Exception as e:  # a bad host or address: tell the worker, which refuses to start
        conn.send_bytes(pickle.dumps(StartFailed(f"{type(e).__name__}: {e}")))
        return 2
    conn.send_bytes(pickle.dumps(bound))
    threading.Thread(
        target=_forward_inbox, args=(channels, conn), name="inbox-forwarder", daemon=True
    ).start()
    try:
        _apply_frames(channels, conn)
    finally:
        channels.close()
    return 0


def _apply_frames(channels: WorkerChannels, conn: Connection) -> None:
    """Until EOF: each frame's operations, in order, with one wake of the I/O thread per frame."""
    while True:
        try:
            ops = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        channels.hold_wakes()
        try:
            for op in ops:
                _apply(channels, op)
        finally:
            channels.release_wakes()


def _apply(channels: WorkerChannels, op: tuple) -> None:
    kind = op[0]
    if kind == OP_SEND:
        channels.send_to(op[1], op[2])
    elif kind == OP_LOAD:
        channels.load = op[1]
    elif kind == OP_REGISTER:
        channels.register(op[1])
    else:
        log.warning("ignoring unknown operation %r from the worker", kind)


def _forward_inbox(channels: WorkerChannels, conn: Connection) -> None:
    inbox = channels.inbox
    while True:
        items = [inbox.get()]
        while not inbox.empty():
            items.append(inbox.get_nowait())
        try:
            conn.send_bytes(pickle.dumps(items, pickle.HIGHEST_PROTOCOL))
        except OSError:  # the worker is gone: the main thread sees EOF and ends the process
            return


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    os._exit(code)  # the forwarder thread may sit in inbox.get(); nothing of ours is left to flush
