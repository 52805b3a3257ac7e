"""The worker-backend contract shared by the launcher and its backends (local processes, Ray).

A backend starts one worker per `WorkerSpec` and hands back a `WorkerHandle`. A worker is the
command line `python -m {spec.module} {argv}` (a mixed worker is a decode_worker started with
`--role mixed`); under Ray an actor supervises the same command. Invariants: `start` returns
without waiting for the worker to be ready (readiness is the router's `/health`); `stop` is
idempotent, escalates to a kill after `grace_s`, and leaves no orphan process; `shutdown` stops
everything the backend started.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

# The module that serves each role (`--role ROLE` picks it within the module).
WORKER_MODULES = {"prefill": "prefill_worker", "decode": "decode_worker", "mixed": "decode_worker"}


@dataclass(frozen=True)
class WorkerSpec:
    role: str  # "prefill" | "decode" | "mixed"
    worker_id: str
    argv: list[str]  # arguments after `python -m {module}`
    num_gpus: float = 0.0  # GPU share (several workers may share one GPU)
    env: dict[str, str] = field(default_factory=dict)
    # Custom scheduler resources the worker reserves, which pick its node (Ray: the actor's `resources`;
    # deploy/placement.py). The local backend runs everything on this host and places nothing.
    resources: dict[str, float] = field(default_factory=dict)
    module_override: str | None = None  # run this module instead (tests use a stand-in worker)
    # Added to the worker's environment like `env`, but never shown: the cluster's CURVE keys
    # (common/net/curve.py). Backends hand it over without a command line or a log line.
    secret_env: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.role not in WORKER_MODULES:
            raise ValueError(f"role must be one of {tuple(WORKER_MODULES)}, got {self.role!r}")
        if self.num_gpus < 0:
            raise ValueError(f"num_gpus must be >= 0, got {self.num_gpus}")

    @property
    def module(self) -> str:
        return self.module_override or WORKER_MODULES[self.role]


class WorkerHandle(ABC):
    spec: WorkerSpec

    @abstractmethod
    def alive(self) -> bool:
        """True while the worker process/actor is running."""

    @abstractmethod
    def stop(self, grace_s: float = 10.0) -> None:
        """Ask the worker to exit (SIGTERM / actor exit), kill it after `grace_s`."""


class WorkerBackend(ABC):
    name: str

    @abstractmethod
    def start(self, spec: WorkerSpec) -> WorkerHandle:
        """Start one worker; returns at once."""

    def cluster_gpus(self) -> int:
        """How many GPUs the workers can be placed on (the default GPU shares split these): here,
        this host's; a backend spanning several hosts counts theirs."""
        import torch  # late: a CPU-only plan never asks

        return torch.cuda.device_count() if torch.cuda.is_available() else 0

    @abstractmethod
    def shutdown(self) -> None:
        """Stop every worker this backend started (and anything it brought up, e.g. a local Ray)."""
