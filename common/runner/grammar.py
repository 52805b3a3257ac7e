"""Structured output on the engine side: per-row allowed-token masks from llguidance matchers.

The matcher of a request lives on the host, on its Sequence (`seq.grammar_state`), and is advanced
over the sequence's completion tokens right before each masked step (`GrammarState.sync`). That one
rule covers every way a sequence reaches a sampling step: a fresh prompt (nothing to consume), a
decode worker's copy of a handed-off request (it consumes the first token the prefill worker sampled
under the same grammar), a preempted and recomputed sequence (nothing new), and tokens removed from
the end (rolled back). llguidance fills a packed int32 bitmask on the host (bit t of word t // 32 =
token t allowed); it travels to the logits' device as [rows, vocab/32] words and is unpacked there
with plain torch ops, so the same code runs on the CPU and on CUDA.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import llguidance
import torch

from common.core.sequence import Sequence
from common.runner.inputs import per_row
from common.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)

_BIT_SHIFTS: dict[torch.device, torch.Tensor] = {}


class GrammarState:
    """One request's matcher and how many of its completion tokens it has consumed."""

    def __init__(self, matcher: llguidance.LLMatcher, request_id: str) -> None:
        self.matcher = matcher
        self.request_id = request_id
        self.consumed = 0
        # Why the matcher went to its error state mid-answer (a token it did not allow, e.g. a first
        # token sampled elsewhere; a resource limit): the request ends, and a worker answers it with an
        # error instead of a finish (`grammar_failure`).
        self.failure: str | None = None

    def sync(self, completion: list[int]) -> None:
        if len(completion) < self.consumed:
            self.matcher.rollback(self.consumed - len(completion))
            self.consumed = len(completion)
        new = completion[self.consumed :]
        if new:
            self.matcher.consume_tokens(new)
            self.consumed = len(completion)

    def fill(self, bits: torch.Tensor, row: int, eos_token_ids: tuple[int, ...]) -> None:
        """Row `row` of `bits`: the tokens the grammar allows next. A matcher in its error state (a
        token it did not allow, an impossible grammar) allows only EOS, so the request ends, and
        `failure` says why."""
        if not self.matcher.is_error():
            # What llguidance.torch.fill_next_token_bitmask does, without importing that module: it
            # decorates a helper with torch.compile, which imports torch._dynamo (~2.5 s per process).
            words = bits[row]  # a contiguous int32 row on the host (mask() allocates it so)
            self.matcher.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * words.element_size())
            return
        if self.failure is None:
            self.failure = _first_line(self.matcher.get_error())
            logger.warning("request %s: grammar error, ending it: %s", self.request_id, self.failure)
        bits[row] = 0
        for t in eos_token_ids:
            bits[row, t // 32] |= _bit(t % 32)


class GrammarMasker:
    """Builds the allowed-token mask of a sampling batch. The llguidance tokenizer (~0.3 s to build
    from the model's tokenizer.json) is made on the first structured-output request."""

    def __init__(self, model_dir: str | Path, eos_token_ids: tuple[int, ...]) -> None:
        self.model_dir = model_dir
        self.eos_token_ids = eos_token_ids
        self._tokenizer: llguidance.LLTokenizer | None = None
        # The grammar threads (runner/grammar_admission.py) may ask for it at once: built once.
        self._tokenizer_lock = threading.Lock()

    def mask(
        self, seqs: list[Sequence], vocab_size: int, device: torch.device, counts: list[int] | None = None
    ) -> torch.Tensor | None:
        """[rows, vocab] bool (True = allowed) for rows in `seqs` order (`counts[i]` rows of `seqs[i]`,
        default one each), or None when no row has a grammar."""
        if all(seq.sampling_params.grammar is None for seq in seqs):
            return None
        if counts is not None:  # grammar requests never verify drafts, but others in the batch may
            seqs = per_row(seqs, counts)
        rows = [i for i, seq in enumerate(seqs) if seq.sampling_params.grammar is not None]
        bits = torch.full((len(seqs), (vocab_size + 31) // 32), -1, dtype=torch.int32)
        for i in rows:
            state = self.state_of(seqs[i], vocab_size)
            state.sync(seqs[i].completion_token_ids)
            state.fill(bits, i, self.eos_token_ids)
        return unpack_bitmask(bits.to(device, non_blocking=True), vocab_size)

    def build(self, seq: Sequence, vocab_size: int) -> GrammarState:
        """`seq`'s matcher with its first mask computed, for admission: what fails here (no tokenizer in
        the model directory, a grammar llguidance refuses against the tokenizer) is a ValueError for
        this request alone, where inside a step it would fail the whole batch or end the request
        silently with an EOS-only mask. The first step reuses the matcher (its lexer built here: the
        same work, done earlier). Reads `seq` only, so a grammar thread may call it
        (runner/grammar_admission.py); the caller attaches the state."""
        state = self._new_state(seq, vocab_size)
        scratch = torch.empty((1, (vocab_size + 31) // 32), dtype=torch.int32)
        matcher = state.matcher
        if not matcher.is_error():
            matcher.unsafe_compute_mask_ptr(scratch.data_ptr(), scratch.numel() * scratch.element_size())
        if matcher.is_error():
            raise ValueError(f"grammar is invalid for this model: {_first_line(matcher.get_error())}")
        return state

    def check(self, seq: Sequence, vocab_size: int) -> None:
        """`build` on this thread, attached to `seq`."""
        seq.grammar_state = self.build(seq, vocab_size)

    def state_of(self, seq: Sequence, vocab_size: int) -> GrammarState:
        """`seq`'s matcher, made now if admission did not build one (a sequence recomputed after a
        failed transfer: its build aside was dropped)."""
        state = seq.grammar_state
        if not isinstance(state, GrammarState):
            state = seq.grammar_state = self._new_state(seq, vocab_size)
        return state

    def _new_state(self, seq: Sequence, vocab_size: int) -> GrammarState:
        grammar = seq.sampling_params.grammar
        if grammar is None:
            raise ValueError(f"request {seq.request_id} has no grammar")
        return GrammarState(llguidance.LLMatcher(self.tokenizer(vocab_size), grammar), seq.request_id)

    def tokenizer(self, vocab_size: int) -> llguidance.LLTokenizer:
        with self._tokenizer_lock:
            if self._tokenizer is None:
                hf = load_tokenizer(self.model_dir)
                if hf is None:
                    raise ValueError(f"grammar needs a tokenizer, and {self.model_dir} has none")
                eos = list(self.eos_token_ids) or None
                import llguidance.hf  # imports transformers (~1.2 s): only once a request has a grammar

                self._tokenizer = llguidance.hf.from_tokenizer(hf, n_vocab=vocab_size, eos_token=eos)
            return self._tokenizer


def grammar_failure(seq: Sequence) -> str | None:
    """Why `seq`'s grammar could not be followed (its matcher failed mid-answer), or None."""
    state = seq.grammar_state
    return state.failure if isinstance(state, GrammarState) else None


def unpack_bitmask(bits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Packed int32 words [rows, W] -> bool [rows, vocab_size], on the words' device."""
    shifts = _BIT_SHIFTS.get(bits.device)
    if shifts is None:
        shifts = _BIT_SHIFTS[bits.device] = torch.arange(32, dtype=torch.int32, device=bits.device)
    return ((bits.unsqueeze(-1) >> shifts) & 1).bool().flatten(1)[:, :vocab_size]


def _first_line(error: str) -> str:
    """llguidance's error without the parser-state dump that may follow it."""
    return error.strip().splitlines()[0] if error.strip() else "rejected by llguidance"


def _bit(index: int) -> int:
    """Bit `index` of an int32 word as a Python int in int32 range (bit 31 is the sign bit)."""
    return -(1 << 31) if index == 31 else 1 << index
