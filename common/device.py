"""What the engine needs to know about the device it runs on (CPU here, CUDA on GPU machines)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class DevicePlatform:
    """A device type with its defaults; all device-specific branching in the engine goes through here."""

    type: str
    index: int = 0

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.type, self.index) if self.type == "cuda" else torch.device("cpu")

    @property
    def is_cuda(self) -> bool:
        return self.type == "cuda"

    def resolve_dtype(self, requested: str, model_dtype: str) -> torch.dtype:
        """ "auto": float32 on the CPU (exact, and fastest there); on CUDA the checkpoint's half
        precision dtype, with float32 checkpoints served in bfloat16 as vLLM does."""
        if requested != "auto":
            return _DTYPES[requested]
        if not self.is_cuda:
            return torch.float32
        dtype = _DTYPES.get(model_dtype.replace("torch.", ""), torch.bfloat16)
        return torch.bfloat16 if dtype == torch.float32 else dtype

    def synchronize(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.torch_device)

    def free_memory_bytes(self) -> int:
        if not self.is_cuda:
            raise RuntimeError("free_memory_bytes is only defined for CUDA")
        free, _total = torch.cuda.mem_get_info(self.torch_device)
        return free

    def total_memory_bytes(self) -> int:
        if not self.is_cuda:
            raise RuntimeError("total_memory_bytes is only defined for CUDA")
        return torch.cuda.mem_get_info(self.torch_device)[1]


def resolve_platform(requested: str, rank: int = 0) -> DevicePlatform:
    if requested == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was requested but CUDA is not available")
    if requested == "cuda" or (requested == "auto" and torch.cuda.is_available()):
        return DevicePlatform("cuda", rank % max(torch.cuda.device_count(), 1))
    return DevicePlatform("cpu")
