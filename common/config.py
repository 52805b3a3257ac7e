"""Engine configuration: a frozen, validated dataclass with no I/O in its constructor."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from common.multiplex.controller import check_drain_has_ratio, check_solo_ratio
from common.wire.roles import ROLES, Role

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "float16", "bfloat16")
ATTENTION_BACKENDS = ("auto", "torch", "triton")
# "auto": the KV cache holds the model dtype; "fp8": float8_e4m3fn values with a float32 scale per token
# and KV head (common/attention/kv_fp8.py maps these names to torch dtypes; this module stays torch-free).
KV_CACHE_DTYPES = ("auto", "fp8")
MUX_SPLITS = ("target", "knee", "drain")  # multiplexed mode's SM split rules (common/multiplex/controller.py)


@dataclass(frozen=True)
class EngineConfig:
    """Everything an engine needs to start, validated on construction.

    `max_model_len=None` means "the model's own limit"; `num_kvcache_blocks=None` means "derive from
    free memory" (`gpu_memory_utilization` on CUDA, `cpu_kvcache_gb` on the CPU). Both are resolved
    when the engine starts, which is where the model directory is first read.
    """

    model: str
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    # While sequences decode, new prompts wait up to this many times the last prompt-carrying step's
    # duration, to be admitted together (vLLM's --scheduler-delay-factor; core/admission_delay.py).
    scheduler_delay_factor: float = 0.0
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.9
    tensor_parallel_size: int = 1
    enforce_eager: bool = False
    kvcache_block_size: int = 16
    num_kvcache_blocks: int | None = None
    cpu_kvcache_gb: float = 2.0
    device: str = "auto"
    dtype: str = "auto"
    attention_backend: str = "auto"
    kv_cache_dtype: str = "auto"  # "fp8": opt-in float8 KV cache (vLLM's --kv-cache-dtype), never the default
    enable_prefix_caching: bool = True
    role: Role = "mixed"
    seed: int = 0
    async_scheduling: bool | None = None  # run-ahead decode steps; None = on for CUDA, off on the CPU
    speculative: str | None = None  # "ngram" (prompt lookup) or "draft" (draft_model); off by default
    draft_model: str | None = None  # HF model dir of the draft model (same vocabulary) for "draft"
    num_speculative_tokens: int = 4
    # Without measured step costs (the CPU): speculation is off while more sequences than this run.
    speculative_max_batch: int = 16
    # One GPU, prefill and decode side by side on SM shares (common/multiplex): mixed role only.
    pd_multiplex: bool = False
    itl_target_ms: float = 30.0  # multiplexed mode: the most decode inter-token gap the SM split holds
    # The split holds this multiple of the decode gap measured with no prefill beside it, at most
    # itl_target_ms (common/multiplex/controller.py); 0: itl_target_ms alone. The default 2 is chosen by
    # measurement (docs/benchmarks.md, session 36, H100): with the graph floor on, it cut the 8B shape's
    # chat ITL p99 to 0.65-0.70x of the fixed 30 ms at one and two long prompts a second for 0.97-1.00x
    # the throughput and goodput, and tied on the real model. Without the floor, two a second left
    # prefill behind for good (session 32: 2,304 against 4,630 tok/s).
    itl_target_solo_ratio: float = 2.0
    # Multiplexed mode's split rule (common/multiplex/controller.py): "target" grows prefill's share while
    # decode gaps stay well under itl_target_ms; "knee" (opt-in until served on the device) stops it at
    # the knee of the measured gap-per-share curve while prefill keeps up; "drain" (opt-in, with a solo
    # ratio) holds itl_target_ms itself instead of the solo-ratio target while prefill is behind.
    mux_split: str = "target"
    # Multiplexed mode: waiting prompts may run inside the decode step (mixed rows, as many as fit in
    # max_num_batched_tokens, as aggregated mode packs them) instead of as chunks on the prefill share,
    # whose launch costs a host-bound model a decode step. mux_inline_measured (opt-in: on one H100
    # it lost goodput to chunks-only on the real model and the 8B shape, docs/benchmarks.md): a prompt is
    # inlined while its uncached tokens stay under the measured break-even against a chunk's host time
    # (common/multiplex/inline_budget.py), at most mux_inline_prompt_tokens (0: DEFAULT_CAP, 512);
    # without it, prompts of at most mux_inline_prompt_tokens are (0: never, the default).
    mux_inline_prompt_tokens: int = 0
    mux_inline_measured: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError("model must be a non-empty path")
        _positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
        _positive_int("max_num_seqs", self.max_num_seqs)
        factor = self.scheduler_delay_factor
        if isinstance(factor, bool) or not isinstance(factor, int | float) or not 0 <= factor <= 100:
            raise ValueError(f"scheduler_delay_factor must be a number in [0, 100], got {factor!r}")
        _positive_int("tensor_parallel_size", self.tensor_parallel_size)
        if self.max_model_len is not None:
            _positive_int("max_model_len", self.max_model_len)
        if self.num_kvcache_blocks is not None:
            _positive_int("num_kvcache_blocks", self.num_kvcache_blocks)
        bs = self.kvcache_block_size
        if not isinstance(bs, int) or isinstance(bs, bool) or not 1 <= bs <= 256 or bs & (bs - 1):
            raise ValueError(f"kvcache_block_size must be a power of two in [1, 256], got {bs!r}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if not self.cpu_kvcache_gb > 0:
            raise ValueError(f"cpu_kvcache_gb must be positive, got {self.cpu_kvcache_gb}")
        _choice("device", self.device, DEVICES)
        _choice("dtype", self.dtype, DTYPES)
        _choice("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        _choice("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)
        _choice("role", self.role, ROLES)
        if self.speculative not in (None, "ngram", "draft"):
            raise ValueError(f"speculative must be None, 'ngram' or 'draft', got {self.speculative!r}")
        if (self.speculative == "draft") != bool(self.draft_model):
            raise ValueError("draft_model must be given exactly when speculative is 'draft'")
        _positive_int("num_speculative_tokens", self.num_speculative_tokens)
        _positive_int("speculative_max_batch", self.speculative_max_batch)
        if self.async_scheduling not in (None, True, False):
            raise ValueError(f"async_scheduling must be a bool or None, got {self.async_scheduling!r}")
        if not isinstance(self.seed, int):
            raise ValueError(f"seed must be an int, got {self.seed!r}")
        self._check_multiplex()

    def _check_multiplex(self) -> None:
        """What multiplexed mode (prefill and decode side by side, common/multiplex) does not combine
        with yet: other roles (it is one mixed engine), speculation (it assumes one step in flight on
        one stream), tensor parallelism (one rank owns both streams)."""
        target = self.itl_target_ms
        if isinstance(target, bool) or not isinstance(target, int | float) or not 0 < target < 1e6:
            raise ValueError(f"itl_target_ms must be a positive number of milliseconds, got {target!r}")
        check_solo_ratio("itl_target_solo_ratio", self.itl_target_solo_ratio)
        if self.pd_multiplex not in (True, False):
            raise ValueError(f"pd_multiplex must be a bool, got {self.pd_multiplex!r}")
        inline = self.mux_inline_prompt_tokens
        if isinstance(inline, bool) or not isinstance(inline, int) or inline < 0:
            raise ValueError(f"mux_inline_prompt_tokens must be an int >= 0, got {inline!r}")
        _choice("mux_split", self.mux_split, MUX_SPLITS)
        drain = self.mux_split == "drain"
        check_drain_has_ratio("mux_split 'drain'", drain, "itl_target_solo_ratio", self.itl_target_solo_ratio)
        if self.mux_inline_measured not in (True, False):
            raise ValueError(f"mux_inline_measured must be a bool, got {self.mux_inline_measured!r}")
        if not self.pd_multiplex:
            return
        if self.role != "mixed":
            raise ValueError(f"pd_multiplex is one mixed engine (prefill and decode), not role {self.role!r}")
        if self.speculative is not None:
            raise ValueError("pd_multiplex does not combine with speculative decoding yet (speculative)")
        if self.tensor_parallel_size != 1:
            raise ValueError("pd_multiplex needs tensor_parallel_size 1")

    def resolve_max_model_len(self, model_limit: int) -> int:
        """The engine's context length: `max_model_len`, or the model's own limit when None."""
        if self.max_model_len is None:
            return model_limit
        if self.max_model_len > model_limit:
            limit = self.max_model_len
            raise ValueError(f"max_model_len ({limit}) exceeds the model's limit ({model_limit})")
        return self.max_model_len

    def with_overrides(self, **kwargs) -> EngineConfig:
        return replace(self, **kwargs)

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)}


def _positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
