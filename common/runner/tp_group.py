"""The tensor-parallel group of one engine: rank 0 is the engine process, ranks 1..N-1 are workers it spawns.

Life of a group:
1. Rank 0 checks that the model splits evenly (ValueError naming the field, before anything starts),
   serves a TCPStore on an ephemeral port and spawns N-1 processes (spawn context, daemonic).
2. Every rank builds a plain gloo (CPU) or NCCL (CUDA, device `cuda:{rank}`) group over that store, loads
   its shard of the weights and allocates its KV-cache shard (its share of the KV heads). The block
   count is agreed on (the smallest any rank can hold), so block ids mean the same on every rank.
3. Each step rank 0 broadcasts the step's `StepPlan` (flat host lists, pickled) and all ranks run the
   forward; the layers' all-reduces and the LM head's all-gather keep them in lock-step. Only rank 0
   samples. Broadcasting `None` tells the workers to exit.

Failure handling: a worker reports its traceback on its pipe to rank 0 and exits. Rank 0 waits for the
workers' start-up reports with a timeout while watching their liveness, checks they are alive before
every step, and turns a failed collective into a RuntimeError carrying the worker's report. A worker
exits when its pipe to rank 0 closes (rank 0 gone), so no worker outlives the engine. Gloo reports a
dead peer at once; NCCL does not, so a worker dying in the middle of a GPU step is only caught by the
group timeout (`PDSERVE_TP_TIMEOUT_S`, default 300 s). After any failure the group refuses further steps.

Spawned workers re-import the launching script's `__main__` module: like vLLM, scripts must create the
`LLM` under `if __name__ == "__main__":`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import threading
import time
import traceback
import weakref
from collections.abc import Iterator
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from common.env_flags import env_float
from common.net.gc_heap import freeze_startup_heap
from common.parallel import check_divisible

logger = logging.getLogger(__name__)

# Bound on start-up (spawn, import, load a shard) and on any one collective; a stuck rank ends as an error.
TIMEOUT_S = env_float("PDSERVE_TP_TIMEOUT_S", 300.0)
_STORE_PREFIX = "pdserve-tp/"


class TPGroup:
    """One rank's membership: the process group, the device collectives use, and (rank 0) the workers."""

    def __init__(self, group: dist.ProcessGroup, device: torch.device, workers: WorkerPool | None) -> None:
        self.group, self.device, self.workers = group, device, workers
        self.rank, self.size = group.rank(), group.size()
        self._state = _Shutdown(group, device, workers)
        # Runs on close(), when the group is garbage-collected, or at interpreter exit.
        self._finalizer = weakref.finalize(self, self._state)

    def broadcast(self, obj: object = None) -> object:
        """Rank 0 sends `obj` (pickled), every other rank returns it."""
        if self._state.broken:  # the ranks fell out of step: any further collective could pair wrongly
            raise RuntimeError(
                "the tensor-parallel group failed earlier; close this engine and start a new one"
            )
        with self.guard():
            if self.workers is not None:
                self.workers.check_alive()
            return broadcast_object(self.group, obj, self.device)

    def agree_num_blocks(self, candidate: int) -> int:
        """The KV block count every rank uses: the smallest any rank can hold."""
        if self.workers is not None:
            self.workers.expect("loaded")  # a worker that failed to load is reported, not waited for
        value = torch.tensor([candidate], dtype=torch.int64, device=self.device)
        with self.guard():
            _all_min(self.group, value)
        return int(value.item())

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Turn a failed collective into a RuntimeError carrying a worker's own report (rank 0)."""
        try:
            yield
        except Exception as exc:
            self._state.broken = True
            report = self.workers.failure(wait_s=2.0) if self.workers is not None else None
            if report is None:
                raise
            raise RuntimeError(f"tensor-parallel worker failed: {report}") from exc

    def close(self) -> None:
        """Tell the workers to stop and wait for them (killing any that linger); idempotent."""
        self._finalizer()

    def abort(self) -> None:
        """Kill the workers without the stop message (they may be inside another collective)."""
        self._state.broken = True
        self._finalizer()


def _all_min(group: dist.ProcessGroup, value: torch.Tensor) -> None:
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.MIN
    group.allreduce([value], opts).wait()


def broadcast_object(group: dist.ProcessGroup, obj: object, device: torch.device) -> object:
    """Pickle `obj` on rank 0 and send it as a byte tensor (length first); other ranks unpickle it."""
    root = group.rank() == 0
    payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8) if root else None
    length = torch.tensor([payload.numel() if root else 0], dtype=torch.int64, device=device)
    group.broadcast([length], dist.BroadcastOptions()).wait()
    data = payload.to(device) if root else torch.empty(int(length.item()), dtype=torch.uint8, device=device)
    group.broadcast([data], dist.BroadcastOptions()).wait()
    return obj if root else pickle.loads(data.cpu().numpy().tobytes())


def make_group(store: dist.Store, rank: int, size: int, device: torch.device) -> dist.ProcessGroup:
    """A plain (non-default) group, so other torch.distributed users in the process are unaffected."""
    prefixed = dist.PrefixStore(_STORE_PREFIX, store)
    if device.type == "cuda":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timedelta(seconds=TIMEOUT_S)
        return dist.ProcessGroupNCCL(prefixed, rank, size, opts)
    opts = dist.ProcessGroupGloo._Options()
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    opts._timeout = timedelta(seconds=TIMEOUT_S)
    return dist.ProcessGroupGloo(prefixed, rank, size, opts)


# ---- rank 0 ------------------------------------------------------------------------------------
def start_group(config, model_config, max_model_len: int, platform) -> TPGroup:
    """Validate, spawn ranks 1..N-1 and join them in a group (rank 0's side). Raises ValueError first."""
    size = config.tensor_parallel_size
    check_divisible(model_config, size)
    if platform.is_cuda and size > torch.cuda.device_count():
        raise ValueError(
            f"tensor_parallel_size ({size}) exceeds the {torch.cuda.device_count()} visible CUDA devices"
        )
    # Port 0: the OS picks a free port; the workers are told which.
    store = dist.TCPStore(
        "127.0.0.1", 0, None, True, timeout=timedelta(seconds=TIMEOUT_S), wait_for_workers=False
    )
    threads = max(1, torch.get_num_threads() // size)
    args = (size, store.port, config, model_config, max_model_len, threads)
    workers = WorkerPool.spawn(args)
    try:
        workers.expect("joining")
        group = make_group(store, 0, size, platform.torch_device)
    except BaseException:
        workers.stop(timeout_s=1.0)
        raise
    workers.store = store  # the store must outlive the group's rendezvous
    return TPGroup(group, platform.torch_device, workers)


class WorkerPool:
    """Rank 0's handles on the worker processes: their status pipes and their lives."""

    def __init__(self, procs: list, conns: list) -> None:
        self.procs, self.conns = procs, conns
        self.reports: dict[int, str] = {}  # rank -> error report received
        self.store: dist.Store | None = None

    @classmethod
    def spawn(cls, args: tuple) -> WorkerPool:
        ctx = mp.get_context("spawn")
        procs, conns = [], []
        for rank in range(1, args[0]):
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=_worker_main, args=(rank, *args, theirs), daemon=True)
            proc.start()
            theirs.close()  # the child holds its end; ours sees EOF when the child dies
            procs.append(proc)
            conns.append(ours)
        return cls(procs, conns)

    def expect(self, stage: str) -> None:
        """Wait until every worker has reported `stage`; an error report or a death raises RuntimeError."""
        deadline = time.monotonic() + TIMEOUT_S
        for rank, conn in enumerate(self.conns, start=1):
            message = self._receive(rank, conn, deadline)
            if message != ("stage", stage):
                raise RuntimeError(
                    f"tensor-parallel rank {rank} failed during start-up: {self.describe(rank)}"
                )

    def _receive(self, rank: int, conn, deadline: float) -> tuple | None:
        while time.monotonic() < deadline:
            if conn.poll(0.05):
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    return None
                if message[0] == "error":
                    self.reports[rank] = message[1]
                return message
            if not self.procs[rank - 1].is_alive():
                return None
        raise RuntimeError(f"tensor-parallel rank {rank} did not start within {TIMEOUT_S:.0f} s")

    def describe(self, rank: int) -> str:
        if rank in self.reports:
            return self.reports[rank]
        code = self.procs[rank - 1].exitcode
        return "still running" if code is None else f"exited with code {code}"

    def check_alive(self) -> None:
        for rank, proc in enumerate(self.procs, start=1):
            if not proc.is_alive():
                raise RuntimeError(f"tensor-parallel rank {rank} is gone: {self.failure(0.5) or 'no report'}")

    def failure(self, wait_s: float) -> str | None:
        """The first worker error report (or death) seen within `wait_s`; None if all look healthy."""
        deadline = time.monotonic() + wait_s
        while True:
            for rank, conn in enumerate(self.conns, start=1):
                with contextlib.suppress(EOFError, OSError):
                    while conn.poll() and (message := conn.recv())[0] == "error":
                        self.reports[rank] = message[1]
                if rank in self.reports or not self.procs[rank - 1].is_alive():
                    return f"rank {rank}: {self.describe(rank)}"
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def stop(self, timeout_s: float) -> None:
        """Join the workers (they were told to stop), then terminate and kill any left; close the pipes."""
        deadline = time.monotonic() + timeout_s
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join(2.0)
        for conn in self.conns:
            conn.close()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]


class _Shutdown:
    """The finalizer's state (it must not reference the TPGroup itself, or it would keep it alive)."""

    def __init__(self, group, device, workers: WorkerPool | None) -> None:
        self.group, self.device, self.workers, self.broken = group, device, workers, False

    def __call__(self) -> None:
        if self.workers is None:
            return
        if not self.broken:
            try:  # tell the workers to leave their step loop; a dead group just skips to the kill
                broadcast_object(self.group, None, self.device)
            except Exception as exc:  # noqa: BLE001 - shutting down anyway
                logger.warning("tensor-parallel stop broadcast failed: %s", exc)
        # Told to stop, workers leave at once; a broken group's workers are stuck, so waiting is pointless.
        self.workers.stop(timeout_s=0.5 if self.broken else 10.0)
        self.group = self.workers.store = None


# ---- ranks 1..N-1 ------------------------------------------------------------------------------
def _worker_main(rank, size, port, config, model_config, max_model_len, threads, conn) -> None:
    """A worker process: join the group, load the shard, run broadcast steps until told to stop."""
    _exit_with_parent(conn)
    try:
        torch.set_num_threads(threads)
        from common.device import resolve_platform
        from common.runner.model_runner import ModelRunner  # here: model_runner imports this module

        platform = resolve_platform(config.device, rank)
        if platform.is_cuda:
            torch.cuda.set_device(platform.torch_device)
        conn.send(("stage", "joining"))
        store = dist.TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=TIMEOUT_S))
        group = TPGroup(make_group(store, rank, size, platform.torch_device), platform.torch_device, None)
        runner = ModelRunner(config, model_config, platform, max_model_len, tp=group)
        runner.load_model()
        conn.send(("stage", "loaded"))
        runner.allocate_kv_cache()
        freeze_startup_heap()  # a full collection here would stall every rank at the next collective
        runner.serve_steps()
    except BaseException:  # noqa: BLE001 - everything is reported to rank 0, then the process ends
        with contextlib.suppress(Exception):
            conn.send(("error", traceback.format_exc()))
        os._exit(1)
    os._exit(0)  # skip interpreter teardown of a group whose peers are leaving too


def _exit_with_parent(conn) -> None:
    """Rank 0 never writes to the pipe: EOF means it closed it or died, and this rank must not linger."""

    def watch() -> None:
        with contextlib.suppress(EOFError, OSError):
            while True:
                conn.recv()
        os._exit(0)

    threading.Thread(target=watch, daemon=True, name="tp-parent-watch").start()
