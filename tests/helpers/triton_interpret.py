"""Runs the project's Triton kernels under the CPU interpreter (`PDSERVE_TRITON_INTERPRET=1`)."""

from __future__ import annotations

import os

ENABLED = os.environ.get("PDSERVE_TRITON_INTERPRET") == "1"


def enable() -> None:
    """Call before any kernel module is imported: @triton.jit reads TRITON_INTERPRET at import."""
    os.environ["TRITON_INTERPRET"] = "1"
    _patch_interpreter_index()


def _patch_interpreter_index() -> None:
    """Triton <= 3.6's interpreter int()s 1-element arrays in `range(...)`, which numpy >= 2.4 refuses.

    Upstream: triton-lang/triton#9171 (fixed by #9172). Harmless where the bug is already fixed.
    """
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched


def setup_or_skip() -> None:
    """Top of a kernel test module, before the kernels' import: the CPU interpreter when
    `PDSERVE_TRITON_INTERPRET=1`, else skip the module unless there is a CUDA GPU."""
    import pytest
    import torch

    if ENABLED:
        enable()
    elif not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU or PDSERVE_TRITON_INTERPRET=1", allow_module_level=True)
    pytest.importorskip("triton")


# Where a kernel test module runs and in which dtype: the interpreter on the CPU in float32 (exact
# enough for tight tolerances), else the GPU in bf16; `marks()` is its `pytestmark`.
DEVICE = "cpu" if ENABLED else "cuda"


def marks() -> list:
    import pytest

    return [] if ENABLED else [pytest.mark.gpu]


def dtype():
    import torch

    return torch.float32 if ENABLED else torch.bfloat16


def rand(*shape: int, scale: float = 1.0):
    """Normal values drawn on the CPU (the same on every device), times `scale`, on DEVICE in dtype()."""
    import torch

    return (torch.randn(*shape, dtype=torch.float32) * scale).to(DEVICE, dtype())
