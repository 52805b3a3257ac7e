"""Token sampling for a batch with per-sequence parameters.

Order of operations (per row): penalties -> logit bias -> min_tokens ban -> grammar mask -> temperature ->
top-k -> top-p -> min-p -> draw. Greedy rows (temperature 0) take the argmax of the adjusted logits.
Draws use the exponential race (argmax of p / E, E ~ Exp(1)), which needs no host sync and lets a
seeded row use its own generator. Logprobs, when asked for, come from the raw model logits.

On CUDA the common rows (greedy or plain temperature, with at most a grammar mask: `plain_rows`)
take one Triton pass over the model's logits in their own dtype (runner/sampling_kernel.py): the
argmax for greedy rows, the same exponential race in log space (Gumbel-max) for the others, with
Philox noise keyed by a per-row seed drawn on the device each step. A seeded row draws that seed
from its own generator, so the same seed gives the same tokens whatever else is in the batch. Rows
with top-k/top-p/min-p, penalties, a logit bias or banned ids take the torch path below, on their rows
alone: the filters and the draw of runner/sampling_filters.py, over each sorted row or, when every
sampling row has a top-k of at most N (`PDSERVE_TOPK_CANDIDATES=N`, 1024 by default; host-known:
`SamplingBatch.top_k_bound`; Qwen3's generation config asks top_k 20), over the rows' N best tokens
only: the same tokens without sorting the vocabulary, the filters and the draw there as one Triton
launch where the fused kernel runs (runner/candidate_kernel.py).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from common.env_flags import env_choice, env_int
from common.layers.fused import use_fused
from common.runner.sampling_filters import candidate_count, draw_among_best, draw_sorted
from common.wire.logprobs import TokenLogprob


@dataclass
class SamplingBatch:
    """Per-row sampling inputs for the rows that sample this step (built by the runner)."""

    temperatures: torch.Tensor  # [B] fp32, 0 = greedy
    top_k: torch.Tensor | None  # [B] int64, 0 = off (None when no row uses it)
    top_p: torch.Tensor | None  # [B] fp32
    min_p: torch.Tensor | None  # [B] fp32
    all_greedy: bool
    generators: list[torch.Generator | None]  # per row (None = shared default); [] when no row is seeded
    # Penalties (None when no row uses them).
    repetition: torch.Tensor | None = None  # [B]
    presence: torch.Tensor | None = None  # [B]
    frequency: torch.Tensor | None = None  # [B]
    output_counts: torch.Tensor | None = None  # [B, V] counts of each token in the output so far
    seen_mask: torch.Tensor | None = None  # [B, V] token appears in prompt or output
    bias: list[list[tuple[int, float]]] | None = None  # per row: (token id, bias) pairs (logit_bias)
    banned: list[list[int]] | None = None  # per row: ids that must not be sampled (min_tokens)
    num_logprobs: list[int | None] | None = None
    any_greedy: bool = True  # some row has temperature 0 (host-known, so no device check is needed)
    allowed: torch.Tensor | None = None  # [B, V] bool, grammar rows' allowed tokens (runner/grammar.py)
    # Host-known, per row: True when the row needs nothing beyond temperature (or greedy) and the
    # grammar mask, so the fused kernel may take it. None: unknown, every row takes the torch path.
    plain_rows: list[bool] | None = None
    # Host-known: every sampling row keeps at most this many tokens (its top_k); None: some row may
    # keep more (no top-k). Greedy rows do not count: filters never change their token.
    top_k_bound: int | None = None


@dataclass
class SamplerOutput:
    token_ids: torch.Tensor  # [B] int64
    logprobs: list[TokenLogprob | None] | None  # per row (None: the row did not ask for them)


class Sampler:
    """`fused`: take plain rows through the Triton kernel (True), never (False), or None (default) as
    `PDSERVE_FUSED_SAMPLING` says, on CUDA with Triton usable only (common.layers.fused.use_fused), so
    the CPU never imports Triton: `auto` (default) for batches with a sampled row (all-greedy batches
    keep torch's one argmax kernel, whose launch costs the host less), `1` for every batch, `0` never.
    The choice never depends on the batch's size, so a seeded row draws the same tokens at any batch.

    The rule, measured on one H200 (benchmarks/engine/sampling.py, synchronised wall us per call, kernel vs
    torch; docs/benchmarks.md "Defaults by measurement"), at the default model's vocabulary (49,152)
    and Qwen3's (151,936), batch 1 / 8 / 64 / 256:
      T=0.6,  49,152:  65 / 46 / 55 / 70 vs 93 / 65 / 84 / 217
      T=0.6,  151,936: 65 / 54 / 51 / 87 vs 97 / 82 / 207 / 633
      greedy, 49,152:  47 / 54 / 50 / 55 vs 15 / 14 / 14 / 20
      greedy, 151,936: 48 / 42 / 39 / 39 vs 18 / 15 / 23 / 54
    so the kernel wins every sampling batch (1.4-7x) and torch every greedy one but 256 x 151,936.
    Rows with top-p/min-p and no top-k sort on the torch path either way (T=0.6, top_p 0.9: 0.34 ms at
    batch 1, 1.8 ms at 256 x 49,152, 5.0 ms at 256 x 151,936); rows with a top-k take their best tokens
    (`PDSERVE_TOPK_CANDIDATES`) and the same switch gives their filters and draw to the candidate kernel
    (113 us per call at batch 1, 415 at 256 x 151,936 on an H100, against 396 and 6,073 sorted).
    End to end the kernel and torch are within noise on the real model (issue 27's workload: 75,148
    vs 74,561 tok/s), now that the kernel compiles at start-up (`warm_up`) instead of mid-run."""

    def __init__(self, fused: bool | None = None) -> None:
        self.fused = fused
        self._mode = fused_sampling_mode()  # read once, not per step
        self._top_k_candidates = top_k_candidates()

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        plain = batch.plain_rows
        if plain and any(plain) and self._use_kernel(logits, batch):
            tokens = self._fused(logits, batch, plain)
        else:
            tokens = self._torch(logits, batch)
        return SamplerOutput(tokens, _logprobs(logits, tokens, batch.num_logprobs))

    def warm_up(self, vocab: int, dtype: torch.dtype, device: torch.device) -> None:
        """Compile the kernel's variants now (start-up) when this sampler may take it, so the first
        sampled step of a run does not stall on Triton's compiler."""
        probe = torch.empty(0, device=device)
        if self.fused is False or (self.fused is None and self._mode == "0") or not use_fused(probe):
            return
        from common.runner import candidate_kernel, sampling_kernel

        sampling_kernel.warm_up(device, vocab, dtype)
        if self._top_k_candidates:
            candidate_kernel.warm_up(device, vocab, dtype)

    def _use_kernel(self, logits: torch.Tensor, batch: SamplingBatch) -> bool:
        if self.fused is not None:
            return self.fused
        if self._mode == "0" or (self._mode == "auto" and batch.all_greedy):
            return False
        return use_fused(logits)

    def _fused(self, logits: torch.Tensor, batch: SamplingBatch, plain: list[bool]) -> torch.Tensor:
        from common.runner import sampling_kernel

        seeds = None if batch.all_greedy else _row_seeds(batch, plain, logits.device)
        tokens = sampling_kernel.pick_tokens(logits, batch.temperatures, seeds, batch.allowed)
        rest = [row for row, p in enumerate(plain) if not p]
        if rest:  # the kernel's picks for these rows are overwritten: one pass beats a gather
            index = torch.tensor(rest, dtype=torch.int64, device=logits.device)
            tokens[index] = self._torch(logits[index], _select_rows(batch, rest, index))
        return tokens

    def _torch(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        adjusted = (
            batch.allowed is not None or batch.repetition is not None or batch.output_counts is not None
        )
        if not (adjusted or batch.banned or batch.bias):
            # Nothing changes the logits: they are read in the model's dtype, with no widened copy of the
            # vocabulary (widening to fp32 is exact and keeps the order; the filters and the draw divide
            # by the temperature in fp32, as they would after widening).
            return logits.argmax(dim=-1) if batch.all_greedy else self._sample(logits, batch)
        logits = _adjust_logits(logits.float(), batch)
        if batch.allowed is not None:
            logits = logits.masked_fill(~batch.allowed, float("-inf"))
        if batch.all_greedy:
            return logits.argmax(dim=-1)
        return self._sample(logits, batch)

    def _sample(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        # A mixed batch needs the argmax rows too; an all-sampling batch skips a full pass over the logits.
        greedy = logits.argmax(dim=-1) if batch.any_greedy else None
        candidates = candidate_count(batch, logits.shape[-1], self._top_k_candidates)
        if candidates is None:
            sampled = draw_sorted(logits, batch)
        else:
            sampled = draw_among_best(logits, batch, candidates, self._use_kernel(logits, batch))
        return sampled if greedy is None else torch.where(batch.temperatures == 0, greedy, sampled)


_SEED_BOUND = 2**62
_FUSED_MODES = ("auto", "0", "1")


# Measured (docs/benchmarks.md "Top-k among each row's best tokens"): 1.4x the sorted rows end to end at
# top_k 20 on the real default model and the Qwen3-0.6B shape; exact whenever it applies.
DEFAULT_TOP_K_CANDIDATES = 1024


def top_k_candidates() -> int:
    """`PDSERVE_TOPK_CANDIDATES=N`: the largest top-k bound under which the filters take each row's best
    tokens instead of sorting it (module docstring); 1024 by default, 0: always sort."""
    return env_int("PDSERVE_TOPK_CANDIDATES", DEFAULT_TOP_K_CANDIDATES, 0, 1 << 20)


def fused_sampling_mode() -> str:
    """`PDSERVE_FUSED_SAMPLING`: auto (default), 0 or 1 (see Sampler)."""
    return env_choice("PDSERVE_FUSED_SAMPLING", _FUSED_MODES, "auto")


def _row_seeds(batch: SamplingBatch, plain: list[bool], device: torch.device) -> torch.Tensor:
    """[B] int64 Philox keys for this step, drawn on the device (no host sync): from the default
    generator, and for a seeded row from its own, which advances one draw per step."""
    seeds = torch.randint(_SEED_BOUND, (len(plain),), dtype=torch.int64, device=device)
    for row, gen in enumerate(batch.generators):
        if gen is not None and plain[row]:
            seeds[row : row + 1].random_(0, _SEED_BOUND, generator=gen)
    return seeds


def _select_rows(batch: SamplingBatch, rows: list[int], index: torch.Tensor) -> SamplingBatch:
    """The batch restricted to `rows` (`index` is the same rows on the device)."""
    picked = {}
    for f in fields(batch):
        value = getattr(batch, f.name)
        if isinstance(value, torch.Tensor):
            value = value[index]
        elif isinstance(value, list) and value:
            value = [value[row] for row in rows]
        picked[f.name] = value
    return SamplingBatch(**picked)


def _adjust_logits(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Penalties, then the logit bias, then the min_tokens ban (out of place: logprobs read the raw
    logits)."""
    if batch.repetition is not None and batch.seen_mask is not None:
        rep = batch.repetition.unsqueeze(1)
        penalised = torch.where(logits > 0, logits / rep, logits * rep)
        logits = torch.where(batch.seen_mask, penalised, logits)
    if batch.output_counts is not None:
        counts = batch.output_counts
        if batch.frequency is not None:
            logits = logits - batch.frequency.unsqueeze(1) * counts
        if batch.presence is not None:
            logits = logits - batch.presence.unsqueeze(1) * (counts > 0).to(logits.dtype)
    if batch.bias:
        logits = _add_bias(logits, batch.bias)
    if batch.banned:
        logits = logits.clone()
        for row, ids in enumerate(batch.banned):
            if ids:
                logits[row, ids] = float("-inf")
    return logits


def _add_bias(logits: torch.Tensor, bias: list[list[tuple[int, float]]]) -> torch.Tensor:
    """Each row's (token id, bias) pairs added to its logits, in one scatter for the batch (ids are
    checked against the vocabulary when the request is admitted: `LLMEngine.make_sequence`)."""
    rows = [row for row, pairs in enumerate(bias) for _ in pairs]
    ids = [token for pairs in bias for token, _ in pairs]
    values = [value for pairs in bias for _, value in pairs]
    device = logits.device
    index = (
        torch.tensor(rows, dtype=torch.int64, device=device),
        torch.tensor(ids, dtype=torch.int64, device=device),
    )
    return logits.index_put(index, torch.tensor(values, dtype=logits.dtype, device=device), accumulate=True)


def _logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, wanted: list[int | None] | None
) -> list[TokenLogprob | None] | None:
    """From the raw model logits, only on steps where some row asks, and only for those rows."""
    rows = [row for row, w in enumerate(wanted or []) if w is not None]
    if not rows or wanted is None:
        return None
    if len(rows) < len(wanted):
        index = torch.tensor(rows, dtype=torch.int64, device=logits.device)
        logits, tokens = logits[index], tokens[index]
    logp = torch.log_softmax(logits.float(), dim=-1)
    chosen = logp.gather(1, tokens.unsqueeze(1)).squeeze(1).tolist()
    k = max(wanted[row] or 0 for row in rows)
    top_vals, top_ids = logp.topk(k, dim=-1)  # k = 0: empty
    out: list[TokenLogprob | None] = [None] * len(wanted)
    for i, row in enumerate(rows):
        w = wanted[row] or 0
        out[row] = TokenLogprob(
            chosen[i], tuple(zip(top_ids[i, :w].tolist(), top_vals[i, :w].tolist(), strict=True))
        )
    return out
