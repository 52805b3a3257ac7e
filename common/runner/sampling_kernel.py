"""One Triton pass over the logits that picks each row's token: greedy argmax or an exact draw.

Imported only on CUDA (or under the Triton interpreter), never on a plain CPU run.

A sampling row takes argmax(logits / T - log E) with E ~ Exp(1) drawn per (row, column): the
exponential race of the torch path in log space (the Gumbel-max trick), an exact draw from
softmax(logits / T) that needs neither the softmax nor a second pass. A greedy row (T = 0) takes the
argmax of the logits themselves, first index on ties as torch.argmax. The logits are read once in
their own dtype (bf16 from the model) and widened to fp32 in registers; the grammar mask, when
given, is read in the same pass.

Randomness: Philox (`tl.randint4x`) keyed by a per-row 64-bit seed that the caller draws on the
device each step (no host sync), with the column's position as the counter. The random number a
column gets depends only on (seed, column), never on the batch size or on how the row is split
across programs, so a seeded row repeats its tokens exactly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from common.runner.sampling_filters import MIN_TEMPERATURE

# Columns per Philox call group: each of the 4 outputs of one Philox call feeds one of 4 sub-blocks
# of LANES columns. Fixed (not tuned per shape) because it defines which random number each column
# gets: changing it changes the draws a given seed produces.
LANES = 1024
CHUNK = 4 * LANES
NUM_WARPS = 8
MAX_SPLITS = 64  # programs per row at most (a power of 2: the merge loads them as one block)


@triton.jit
def _log2(x, FAST: tl.constexpr):
    """log2: the hardware's approximation on the GPU (lg2.approx: ample for noise keys, and _exp1
    keeps its arguments away from 1, where an approximation loses precision); numpy's under the
    interpreter."""
    if FAST:
        return libdevice.fast_log2f(x)
    else:
        return tl.log2(x)


@triton.jit
def _exp1(r, FAST: tl.constexpr):
    """Exp(1) from 32 random bits, strictly positive and finite. -log(u) loses all precision as u -> 1
    (where the small, decisive E live), so that end uses the series of -log(1 - w) on w = 1 - u,
    with w exact in fp32."""
    k = (r >> 9).to(tl.float32)  # 23 bits: k + 0.5 is exact in fp32
    u = (k + 0.5) * 1.1920928955078125e-07
    w = (8388607.5 - k) * 1.1920928955078125e-07
    series = w * (1.0 + w * (0.5 + w * (0.3333333333 + w * 0.25)))
    return tl.where(w < 0.0078125, series, -_log2(u, FAST) * 0.6931471805599453)


@triton.jit
def _scan_block(
    row_ptr,
    allowed_row,
    cols,
    n_cols,
    best,
    best_col,
    r,
    scale,
    HAS_ALLOWED: tl.constexpr,
    SAMPLE: tl.constexpr,
    FAST: tl.constexpr,
):
    """One block of columns into each lane's running (best key, its column)."""
    mask = cols < n_cols
    x = tl.load(row_ptr + cols, mask=mask, other=float("-inf")).to(tl.float32)
    if HAS_ALLOWED:
        ok = tl.load(allowed_row + cols, mask=mask, other=0)
        x = tl.where(ok != 0, x, float("-inf"))
    if SAMPLE:
        key = x * scale - _log2(_exp1(r, FAST), FAST)  # log2 units: ranks as x / T - ln E
    else:
        key = tl.where(x != x, float("inf"), x)  # NaN ranks first, as in torch.argmax
    # Each lane sees its columns in increasing order, so a strict > keeps the first of equal keys.
    better = key > best
    return tl.where(better, key, best), tl.where(better, cols, best_col)


@triton.jit
def _scan(
    row_ptr,
    allowed_row,
    seed,
    scale,
    n_cols,
    first,
    last,
    LANES: tl.constexpr,
    HAS_ALLOWED: tl.constexpr,
    SAMPLE: tl.constexpr,
    FAST: tl.constexpr,
):
    """The best key and its column over chunks [first, last) of a row. Chunk c's 4 blocks of LANES
    columns take the 4 outputs of Philox at counters c * LANES + lane."""
    lanes = tl.arange(0, LANES)
    best = tl.full([LANES], float("-inf"), tl.float32)
    best_col = first * 4 * LANES + lanes  # each lane's first column: the answer for an all -inf row
    for i in range(0, last - first):
        c = first + i
        base = c * 4 * LANES + lanes
        if SAMPLE:
            r0, r1, r2, r3 = tl.randint4x(seed, c * LANES + lanes)
        else:  # unused
            r0 = lanes
            r1 = lanes
            r2 = lanes
            r3 = lanes
        for k in tl.static_range(4):
            if k == 0:
                r = r0
            elif k == 1:
                r = r1
            elif k == 2:
                r = r2
            else:
                r = r3
            best, best_col = _scan_block(
                row_ptr,
                allowed_row,
                base + k * LANES,
                n_cols,
                best,
                best_col,
                r,
                scale,
                HAS_ALLOWED,
                SAMPLE,
                FAST,
            )
    top = tl.max(best, axis=0)
    return top, tl.min(tl.where(best == top, best_col, 2147483647), axis=0)


# The per-call integers are not specialised: Triton compiles a variant for an int equal to 1 (and one
# divisible by 16), and `chunks_per_split` is 1 at small batches and 2-6 at large ones for a 49,152
# vocabulary (12 chunks), so a run that grew past ~22 rows compiled a second kernel mid-run (~0.5-1 s
# of a stalled step loop; on the real default model that halved a short offline run's throughput).
@triton.jit(do_not_specialize=["n_cols", "chunks_per_split", "n_chunks"])
def _pick_kernel(
    logits_ptr,
    stride,
    temp_ptr,
    seed_ptr,
    allowed_ptr,
    allowed_stride,
    part_key_ptr,
    part_col_ptr,
    count_ptr,
    out_ptr,
    n_cols,
    chunks_per_split,
    n_chunks,
    min_temp,
    HAS_ALLOWED: tl.constexpr,
    SPLIT: tl.constexpr,
    FAST: tl.constexpr,
    MAX_SPLITS: tl.constexpr,
    LANES: tl.constexpr,
):
    row = tl.program_id(0)
    split = tl.program_id(1)
    first = split * chunks_per_split
    last = first + chunks_per_split
    if last > n_chunks:
        last = n_chunks
    row_ptr = logits_ptr + row.to(tl.int64) * stride
    allowed_row = allowed_ptr + row.to(tl.int64) * allowed_stride
    temp = tl.load(temp_ptr + row)
    if temp == 0.0:
        top, col = _scan(row_ptr, allowed_row, 0, 1.0, n_cols, first, last, LANES, HAS_ALLOWED, False, FAST)
    else:
        seed = tl.load(seed_ptr + row)
        scale = 1.4426950408889634 / tl.maximum(temp, min_temp)
        top, col = _scan(
            row_ptr, allowed_row, seed, scale, n_cols, first, last, LANES, HAS_ALLOWED, True, FAST
        )
    if SPLIT:
        _merge_when_last(part_key_ptr, part_col_ptr, count_ptr, out_ptr, row, split, top, col, MAX_SPLITS)
    else:
        tl.store(out_ptr + row, col.to(tl.int64))


@triton.jit
def _merge_when_last(
    part_key_ptr, part_col_ptr, count_ptr, out_ptr, row, split, top, col, MAX_SPLITS: tl.constexpr
):
    """Each split posts its winner; the row's last split to finish (a per-row counter, reset by that
    split for the next call) takes the best, the smallest column among equal keys: splits cover
    increasing columns, so that is the first one, as in a single scan. One launch, no merge kernel."""
    n_splits = tl.num_programs(1)
    tl.store(part_key_ptr + row * MAX_SPLITS + split, top)
    tl.store(part_col_ptr + row * MAX_SPLITS + split, col)
    tl.debug_barrier()  # the posted winner before the counter: the atomic below releases both
    if tl.atomic_add(count_ptr + row, 1, sem="acq_rel") == n_splits - 1:
        offs = tl.arange(0, MAX_SPLITS)
        mask = offs < n_splits
        # volatile: never an L1 line cached by an earlier call on this SM
        keys = tl.load(part_key_ptr + row * MAX_SPLITS + offs, mask=mask, other=float("-inf"), volatile=True)
        cols = tl.load(part_col_ptr + row * MAX_SPLITS + offs, mask=mask, other=2147483647, volatile=True)
        best = tl.max(keys, axis=0)
        tl.store(out_ptr + row, tl.min(tl.where(keys == best, cols, 2147483647), axis=0).to(tl.int64))
        tl.store(count_ptr + row, 0)


class _Device:
    """Per device and stream: how many programs fill the device, and the workspace of the one-launch
    merge (the split winners and per-row counters, zero between calls), grown as needed. Launches on
    one stream run one after another, so they never use a workspace at the same time; launches on
    two streams (a multiplexed prefill chunk's sampling beside a decode step's) each have their own."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        # Enough programs to keep every SM busy: at batch 1 one program per row would read the
        # 300 KB row and run its Philox rounds on one SM alone.
        self.programs = (
            2 * torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
        )
        self.fast = device.type == "cuda"  # the interpreter runs on the CPU, without PTX
        self.rows = 0
        self.part_key = self.part_col = self.counts = torch.empty(0, device=device)

    def ensure(self, rows: int) -> None:
        if rows <= self.rows:
            return
        self.rows = max(rows, 2 * self.rows)
        self.part_key = torch.empty(self.rows * MAX_SPLITS, dtype=torch.float32, device=self.device)
        self.part_col = torch.empty(self.rows * MAX_SPLITS, dtype=torch.int32, device=self.device)
        self.counts = torch.zeros(self.rows, dtype=torch.int32, device=self.device)


_devices: dict[tuple[torch.device, int], _Device] = {}


def _device(device: torch.device) -> _Device:
    """The state of `device` for the current stream (one workspace per stream)."""
    key = (device, torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0)
    state = _devices.get(key)
    if state is None:
        state = _devices[key] = _Device(device)
    return state


def _chunks_per_split(n_chunks: int, rows: int, splits: int | None, programs: int) -> int:
    """Each program scans a contiguous run of whole chunks; `splits` (or enough to reach `programs`
    in all) programs share a row, at most MAX_SPLITS."""
    wanted = splits or triton.cdiv(programs, rows)
    return triton.cdiv(n_chunks, min(wanted, n_chunks, MAX_SPLITS))


def num_splits(rows: int, n_cols: int, device: torch.device) -> int:
    """How many programs share one row by default."""
    n_chunks = triton.cdiv(n_cols, CHUNK)
    return triton.cdiv(n_chunks, _chunks_per_split(n_chunks, rows, None, _device(device).programs))


def warm_up(device: torch.device, n_cols: int, dtype: torch.dtype) -> None:
    """Compile every variant a run can reach (split or not, with or without a grammar mask), so no
    step compiles one. One row of logits suffices (the engine calls this once the KV cache holds most
    of the memory): `splits=1` scans the whole row, the variant of batches past `programs` rows."""
    logits = torch.zeros(1, n_cols, dtype=dtype, device=device)
    temperatures = torch.ones(1, dtype=torch.float32, device=device)
    seeds = torch.zeros(1, dtype=torch.int64, device=device)
    allowed = torch.ones(1, n_cols, dtype=torch.bool, device=device)
    for mask in (None, allowed):
        for splits in (None, 1):
            pick_tokens(logits, temperatures, seeds, mask, splits)


def pick_tokens(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    seeds: torch.Tensor | None,
    allowed: torch.Tensor | None = None,
    splits: int | None = None,
) -> torch.Tensor:
    """[B] int64 tokens: argmax for rows with temperature 0, an exact draw from softmax(logits / T)
    otherwise. `seeds`: [B] int64 Philox keys (None only when every row is greedy); `allowed`:
    optional [B, V] bool mask (False = never picked); `splits`: programs per row (default: enough
    to fill the GPU, at most MAX_SPLITS)."""
    rows, n_cols = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    state = _device(logits.device)
    out = torch.empty(rows, dtype=torch.int64, device=state.device)
    if rows == 0:
        return out
    n_chunks = triton.cdiv(n_cols, CHUNK)
    per_split = _chunks_per_split(n_chunks, rows, splits, state.programs)
    state.ensure(rows)
    if allowed is not None:
        allowed = allowed.contiguous().view(torch.uint8)
    _pick_kernel[(rows, triton.cdiv(n_chunks, per_split))](
        logits,
        logits.stride(0),
        temperatures,
        out if seeds is None else seeds,
        out if allowed is None else allowed,
        0 if allowed is None else allowed.stride(0),
        state.part_key,
        state.part_col,
        state.counts,
        out,
        n_cols,
        per_split,
        n_chunks,
        MIN_TEMPERATURE,
        HAS_ALLOWED=allowed is not None,
        SPLIT=per_split < n_chunks,
        FAST=state.fast,
        MAX_SPLITS=MAX_SPLITS,
        LANES=LANES,
        num_warps=NUM_WARPS,
    )
    return out
