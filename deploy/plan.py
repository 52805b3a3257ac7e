"""What `deploy.launch` starts: the validated `LaunchPlan` and the pure planning from it (worker
specs, GPU shares, CPU threads). No I/O here; `launch.py` carries the plan out.

Workers: `num_prefill` prefill, `num_decode` decode and `num_mixed` mixed workers (a mixed worker is a
decode_worker started with `--role mixed`, prefill and decode in one engine). At least one worker must
be able to decode (decode or mixed); `--prefill 0 --decode 0 --mixed 2` serves through mixed workers
alone. GPU sharing: with CUDA, W workers on G GPUs each get a 1/ceil(W/G) share (or
`--gpus-per-worker`) and `--gpu-memory-utilization` scaled by it, so the shares placed on one GPU sum
to at most `--gpu-memory-utilization`; each worker sizes its KV cache from its own share
(common/worker/engine_factory.py).

One GPU: `--prefill 1 --decode 1` on a cluster with exactly one GPU starts ONE mixed worker in
multiplexed mode instead (`--pd-multiplex`, common/multiplex): prefill and decode side by side on SM
shares of the GPU, weights loaded once, no KV copy between them. `pd_multiplex=False`
(`--no-pd-multiplex`) keeps the two workers. Not with `--speculative`, tensor parallelism or
`--gpus-per-worker` (the mode refuses the first two; the last asks for the two-worker layout).
`--mps` also keeps the workers apart and runs them under a private MPS daemon (deploy/mps.py), so
their kernels share the GPU's SMs instead of taking turns; local workers on GPUs only.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import dataclass, field

from common.engine_args import engine_argv
from common.net.addresses import WILDCARD_HOSTS
from common.worker.config import WORKER_FLAGS
from deploy.base import WorkerSpec
from deploy.placement import RayResources, resources_for

BACKENDS = ("ray", "local")


@dataclass(frozen=True)
class LaunchPlan:
    model: str
    num_prefill: int = 1
    num_decode: int = 1
    num_mixed: int = 0
    host: str = "127.0.0.1"
    port: int = 8000
    backend: str = "ray"
    kv_transport: str = "auto"
    gpus_per_worker: float | None = None
    engine: dict = field(default_factory=dict)  # explicit engine flags, forwarded to every worker
    advertise_host: str | None = None  # where workers reach the router (default: host, or loopback)
    ray_address: str | None = None
    ray_resources: RayResources = field(default_factory=dict)  # custom Ray resources per role (placement.py)
    log_dir: str | None = None
    log_level: str = "info"
    startup_timeout_s: float = 600.0
    api_key: str | None = field(default=None, repr=False)  # for the router; never logged
    protect_status: bool = False
    router_argv: tuple[str, ...] = ()  # extra router flags (deploy.passthrough)
    worker_argv: tuple[str, ...] = ()  # extra flags for every worker
    api_servers: int = 1  # HTTP front processes sharing `port` (deploy/fronts.py)
    pd_multiplex: bool = True  # one GPU, --prefill 1 --decode 1: one multiplexed worker (see above)
    mps: bool = False  # workers under a private MPS daemon (deploy/mps.py); never multiplexed

    def __post_init__(self) -> None:
        for name in ("num_prefill", "num_decode", "num_mixed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        if self.num_decode + self.num_mixed == 0:
            raise ValueError("num_decode + num_mixed must be at least 1: no worker could decode")
        if (
            isinstance(self.api_servers, bool)
            or not isinstance(self.api_servers, int)
            or self.api_servers < 1
        ):
            raise ValueError(f"api_servers must be an int >= 1, got {self.api_servers!r}")
        if self.api_servers > 1 and "--inbox-port" in self.router_argv:
            raise ValueError("api_servers > 1 takes no --inbox-port: each front binds its own inbox")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.gpus_per_worker is not None and not 0 < self.gpus_per_worker <= 1:
            raise ValueError(f"gpus_per_worker must be in (0, 1], got {self.gpus_per_worker}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.ray_resources and self.backend != "ray":
            raise ValueError(f"ray_resources place Ray actors; backend {self.backend!r} has none to place")
        if self.engine.get("pd_multiplex") and (self.num_prefill or self.num_decode):
            raise ValueError(
                "--pd-multiplex is for mixed workers (--prefill 0 --decode 0 --mixed N); "
                "--prefill 1 --decode 1 on one GPU uses it on its own"
            )
        if self.mps and self.backend != "local":
            raise ValueError("--mps runs the workers under this host's MPS daemon: only with --backend local")
        if self.mps and self.engine.get("device") == "cpu":
            raise ValueError("--mps shares a GPU between workers: not with --device cpu")
        if self.protect_status and not self.api_key:
            raise ValueError(
                "protect_status needs api_key: there is no key to protect the status routes with"
            )

    @property
    def roles(self) -> list[str]:
        """The role of each worker to start, in start order."""
        return ["prefill"] * self.num_prefill + ["decode"] * self.num_decode + ["mixed"] * self.num_mixed

    @property
    def inbox_host(self) -> str:
        if self.advertise_host:
            return self.advertise_host
        return "127.0.0.1" if self.host in WILDCARD_HOSTS else self.host


def gpu_layout(num_workers: int, num_gpus: int, per_worker: float | None) -> list[tuple[float, int | None]]:
    """(GPU share, GPU index for local placement) per worker; no GPUs -> (0.0, None) each."""
    if num_gpus == 0:
        return [(0.0, None)] * num_workers
    share = per_worker if per_worker is not None else 1.0 / math.ceil(num_workers / num_gpus)
    return [(share, i % num_gpus) for i in range(num_workers)]


def multiplexes(plan: LaunchPlan, num_gpus: int) -> bool:
    """Whether the plan's one prefill and one decode worker run as one multiplexed mixed worker."""
    return (
        plan.pd_multiplex
        and not plan.mps
        and num_gpus == 1
        and (plan.num_prefill, plan.num_decode, plan.num_mixed) == (1, 1, 0)
        and plan.gpus_per_worker is None
        and plan.engine.get("speculative") is None
        and plan.engine.get("tensor_parallel_size", 1) == 1
    )


def worker_specs(plan: LaunchPlan, inbox: str, num_gpus: int) -> list[WorkerSpec]:
    """One spec per worker: its role, id (`{role}-{i}`), command line, GPU share and environment."""
    multiplexed = multiplexes(plan, num_gpus)
    roles = ["mixed"] if multiplexed else plan.roles
    counts: Counter[str] = Counter()
    base_util = plan.engine.get("gpu_memory_utilization", 0.9)
    # Ray picks the node and GPU itself, so there workers find their own address ("auto").
    host = "auto" if plan.backend == "ray" else plan.inbox_host
    specs = []
    for role, (share, gpu) in zip(roles, gpu_layout(len(roles), num_gpus, plan.gpus_per_worker), strict=True):
        worker_id = f"{role}-{counts[role]}"
        counts[role] += 1
        engine = dict(plan.engine, pd_multiplex=True) if multiplexed else dict(plan.engine)
        if share:
            engine["gpu_memory_utilization"] = round(base_util * share, 4)
        launcher_set = {
            "router_addr": inbox,
            "host": host,
            "worker_id": worker_id,
            "kv_transport": plan.kv_transport,
        }
        argv = ["--role", role, "--model", plan.model, *WORKER_FLAGS.argv(launcher_set)]
        argv += ["--log-level", plan.log_level, *engine_argv(engine)]
        argv += list(plan.worker_argv)
        local_gpu = plan.backend == "local" and gpu is not None
        env = {"CUDA_VISIBLE_DEVICES": visible_devices(gpu, num_gpus)} if local_gpu else {}
        if num_gpus == 0:
            env.update(cpu_thread_env(len(roles)))
        resources = resources_for(plan.ray_resources, role)
        specs.append(WorkerSpec(role, worker_id, argv, num_gpus=share, env=env, resources=resources))
    return specs


def visible_devices(gpu: int, num_gpus: int) -> str:
    """CUDA_VISIBLE_DEVICES for a worker placed on `gpu`: its own GPU first (so it is the worker's
    cuda:0), then every other GPU of the host. The others must stay visible: CUDA IPC mappings of a
    peer's KV cache and NCCL's peer-to-peer path both need the peer's GPU in the process."""
    return ",".join(str((gpu + i) % num_gpus) for i in range(num_gpus))


def cpu_thread_env(num_workers: int) -> dict[str, str]:
    """On the CPU, split the cores between the workers: each torch process otherwise starts one thread
    per core, and N workers spinning N x cores threads on the same cores run many times slower.
    An explicit OMP_NUM_THREADS in the launcher's environment wins."""
    if "OMP_NUM_THREADS" in os.environ:
        return {}
    return {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // num_workers))}
