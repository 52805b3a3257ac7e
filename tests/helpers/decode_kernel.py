"""Settings the decode kernel's tests share (tests/unit/common/attention): under the Triton interpreter
(`PDSERVE_TRITON_INTERPRET=1`) small float32 heads on the CPU with tight tolerances, else bf16 heads of
the real size on the GPU. Importing this imports no kernel module (call `setup_or_skip` first anyway)."""

from __future__ import annotations

import torch

from tests.helpers.triton_interpret import ENABLED as INTERPRET

DEVICE = "cpu" if INTERPRET else "cuda"
DTYPE = torch.float32 if INTERPRET else torch.bfloat16
HEAD_DIM = 32 if INTERPRET else 128
NUM_KV_HEADS = 2
TOL = dict(atol=2e-5, rtol=1e-5) if INTERPRET else dict(atol=2e-2, rtol=2e-2)
