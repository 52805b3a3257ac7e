"""Router configuration: a frozen dataclass validated on construction, no I/O."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from common.net.curve import CurveKeys
from common.wire.generation_config import GENERATION_CONFIG_AUTO
from router.disagg import DEFAULT_DISAGG, DEFAULT_STALL_WEIGHT, DISAGG_MODES
from router.kv_probes import DEFAULT_PROBE_BYTES
from router.policy import ROUTING_POLICIES

API_KEY_ENV = "PDSERVE_API_KEY"  # where `python -m router` and `deploy.launch` read the default key


@dataclass(frozen=True)
class RouterConfig:
    """Everything the router needs to start.

    `port=0` / `inbox_port=0` ask the OS for free ports; the bound addresses are reported through the
    ready file. `inbox_host` is both where the inbox binds and the address workers are told to push
    to, so on a multi-host cluster it must be this node's cluster-facing IP, not 0.0.0.0.
    `request_timeout` bounds one request end to end (None: no limit). `block_size=None` adopts the
    first accepted worker's block size. `api_key` (None: no auth) is required as a Bearer token on
    /v1/*, and on every route with `protect_status` (see router/auth.py). `disagg` and
    `disagg_stall_weight` choose between remote and local prefill (see router/disagg.py).
    `generation_config` says where requests' missing sampling values come from: "auto" (the model's
    generation_config.json), "vllm" (the engine's defaults) or a directory (read at start-up, see
    common/wire/generation_config.py). `kv_probe_mb` is the size of the probe transfer each prefill/decode
    pair runs when it forms (0: no probes) and `kv_probe_min_gbps` the floor below which a pair is
    degraded (0: none; see router/kv_probes.py). `curve`: the cluster's CURVE keys (common/net/curve.py),
    from the environment; None leaves the inbox open to anyone who can reach it. `max_running_requests`
    bounds the generation requests in flight (router/inflight.py); `stream_interval` is how many tokens a
    streamed choice gathers per SSE chunk after its first (1: a chunk per token message, as before).
    Several fronts (deploy.launch --api-servers N): `front` is this process's index (it labels /metrics
    samples and /health; None: the only front) and `reuse_port` binds the HTTP port with SO_REUSEPORT,
    so every front listens on the same port and the kernel spreads connections between them.
    `fronts_dir` (needs `front`) is the directory the launcher shares between the fronts: their in-flight
    slots, so `max_running_requests` bounds all of them together (router/front_slots.py), and their
    metrics snapshots, which /metrics sums (router/front_metrics.py); None: this front counts alone.
    """

    model: str
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    inbox_host: str = "127.0.0.1"
    inbox_port: int = 0
    routing: str = "prefix"
    balance_threshold_tokens: int = 2048
    request_timeout: float | None = 600.0
    heartbeat_timeout: float = 5.0
    snapshot_retry_interval: float = 2.0
    block_size: int | None = None
    max_running_requests: int = 4096
    admission_wait_s: float = 0.0  # how long a request past the bound waits for a place before its 429
    stream_interval: int = 1
    max_body_bytes: int = 8 * 1024 * 1024
    max_retries: int = 1
    ready_file: str | None = None
    api_key: str | None = field(default=None, repr=False)  # repr=False: a logged config never shows it
    protect_status: bool = False
    disable_uvicorn_access_log: bool = False  # as vLLM's flag: no access line per request
    disagg: str = DEFAULT_DISAGG
    disagg_stall_weight: float = DEFAULT_STALL_WEIGHT
    generation_config: str = GENERATION_CONFIG_AUTO
    kv_probe_mb: float = DEFAULT_PROBE_BYTES / (1 << 20)
    kv_probe_min_gbps: float = 0.0
    curve: CurveKeys | None = field(default=None, repr=False)
    front: int | None = None
    reuse_port: bool = False
    fronts_dir: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError("model must be a non-empty path")
        for name in ("port", "inbox_port"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
                raise ValueError(f"{name} must be a port number in [0, 65535], got {value!r}")
        if self.routing not in ROUTING_POLICIES:
            raise ValueError(f"routing must be one of {ROUTING_POLICIES}, got {self.routing!r}")
        bt = self.balance_threshold_tokens
        if isinstance(bt, bool) or not isinstance(bt, int) or bt < 0:
            raise ValueError(f"balance_threshold_tokens must be an int >= 0, got {bt!r}")
        if self.request_timeout is not None and not self.request_timeout > 0:
            raise ValueError(f"request_timeout must be positive or None, got {self.request_timeout!r}")
        for name in ("heartbeat_timeout", "snapshot_retry_interval"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
        wait = self.admission_wait_s
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait < math.inf:
            raise ValueError(f"admission_wait_s must be a finite number of seconds >= 0, got {wait!r}")
        for name in ("max_running_requests", "max_body_bytes", "stream_interval"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive int, got {getattr(self, name)!r}")
        if not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ValueError(f"max_retries must be a non-negative int, got {self.max_retries!r}")
        if self.block_size is not None and (not isinstance(self.block_size, int) or self.block_size < 1):
            raise ValueError(f"block_size must be a positive int or None, got {self.block_size!r}")
        self._check_auth()
        self._check_front()
        if self.curve is not None and not isinstance(self.curve, CurveKeys):
            raise ValueError("curve must be CurveKeys or None")
        if self.disagg not in DISAGG_MODES:
            raise ValueError(f"disagg must be one of {DISAGG_MODES}, got {self.disagg!r}")
        w = self.disagg_stall_weight
        if isinstance(w, bool) or not isinstance(w, int | float) or not 0 <= w < float("inf"):
            raise ValueError(f"disagg_stall_weight must be a finite number >= 0, got {w!r}")
        for name in ("kv_probe_mb", "kv_probe_min_gbps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < float("inf"):
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        if not isinstance(self.generation_config, str) or not self.generation_config:
            raise ValueError(
                f"generation_config must be 'auto', 'vllm' or a directory, got {self.generation_config!r}"
            )

    def _check_auth(self) -> None:
        # The key travels in an HTTP header: printable ASCII without spaces is what every client can send.
        key = self.api_key
        if key is not None and (
            not isinstance(key, str) or not key or not all(33 <= ord(c) < 127 for c in key)
        ):
            raise ValueError("api_key must be a non-empty string of printable ASCII without spaces (or None)")
        if not isinstance(self.protect_status, bool):
            raise ValueError(f"protect_status must be a bool, got {self.protect_status!r}")
        if self.protect_status and key is None:
            raise ValueError(
                "protect_status needs api_key: there is no key to protect the status routes with"
            )

    def _check_front(self) -> None:
        if self.front is not None and (
            isinstance(self.front, bool) or not isinstance(self.front, int) or self.front < 0
        ):
            raise ValueError(f"front must be an int >= 0 or None, got {self.front!r}")
        if not isinstance(self.reuse_port, bool):
            raise ValueError(f"reuse_port must be a bool, got {self.reuse_port!r}")
        if self.fronts_dir is not None:
            if not isinstance(self.fronts_dir, str) or not self.fronts_dir:
                raise ValueError(f"fronts_dir must be a non-empty path or None, got {self.fronts_dir!r}")
            if self.front is None:
                raise ValueError("fronts_dir needs front: each front's share of it is named by its index")

    @property
    def kv_probe_bytes(self) -> int:
        return int(self.kv_probe_mb * (1 << 20))

    @property
    def model_name(self) -> str:
        """The name clients put in "model" (defaults to the model directory's name)."""
        return self.served_model_name or os.path.basename(os.path.normpath(self.model))

    def accepts_model(self, name: str | None) -> bool:
        """A request may name the served name or the path; omitting it means the one model served."""
        return name is None or name in (self.model_name, self.model)
