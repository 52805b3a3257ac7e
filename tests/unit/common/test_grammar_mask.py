"""The grammar mask (common/runner/grammar.py): llguidance's packed bitmask unpacked with torch ops
equals a bit-by-bit reading, the sampler never picks a token the mask forbids (greedy or sampled), and
a matcher follows its sequence's tokens however they arrive (all at once after a hand-off, one by
one, or rolled back)."""

from __future__ import annotations

import pytest
import torch

from common.core.sequence import Sequence
from common.model_config import ModelConfig
from common.runner.grammar import GrammarMasker, unpack_bitmask
from common.runner.inputs import prepare_sampling
from common.runner.sampler import Sampler
from common.tools.default_model import prepare_default_model
from common.wire.sampling_params import SamplingParams
from common.wire.structured_output import choice_grammar, json_schema_grammar, regex_grammar

VOCAB = 49152  # SmolLM2's


def test_unpack_matches_a_bit_by_bit_reading():
    gen = torch.Generator().manual_seed(0)
    words = torch.randint(-(2**31), 2**31 - 1, (3, 5), dtype=torch.int32, generator=gen)
    vocab = 150  # not a multiple of 32: the last word's high bits are cut
    want = [[bool((int(words[r, t // 32]) >> (t % 32)) & 1) for t in range(vocab)] for r in range(3)]
    assert unpack_bitmask(words, vocab).tolist() == want


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_sampler_only_picks_allowed_tokens(temperature):
    rows, vocab = 4, 1000
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(rows, vocab, generator=gen) * 5
    allowed = torch.rand(rows, vocab, generator=gen) < 0.01
    allowed[:, 7] = True  # at least one token per row
    seqs = [Sequence([1, 2], SamplingParams(temperature=temperature), block_size=16) for _ in range(rows)]
    batch = prepare_sampling(seqs, vocab, torch.device("cpu"))
    batch.allowed = allowed
    for _ in range(20):
        tokens = Sampler()(logits, batch).token_ids
        assert allowed[torch.arange(rows), tokens].all()
    if temperature == 0:
        assert tokens.tolist() == logits.masked_fill(~allowed, float("-inf")).argmax(-1).tolist()


@pytest.fixture(scope="module")
def masker():
    model_dir = prepare_default_model(progress=False)
    return GrammarMasker(model_dir, ModelConfig.from_dir(model_dir).eos_token_ids), model_dir


def _allowed(masker: GrammarMasker, seq: Sequence) -> set[int]:
    mask = masker.mask([seq], VOCAB, torch.device("cpu"))
    assert mask is not None
    return set(mask[0].nonzero().flatten().tolist())


def test_the_matcher_follows_the_sequence(masker):
    masker, model_dir = masker
    tok = masker.tokenizer(VOCAB)
    eos = set(masker.eos_token_ids)
    grammar = choice_grammar(["yes please", "no"])
    prompt = [1, 2, 3]
    fresh = Sequence(prompt, SamplingParams(grammar=grammar), block_size=16)
    first = _allowed(masker, fresh)
    assert tok.tokenize_str("no")[0] in first and not first & eos
    # A decode worker's copy arrives with the prefill worker's first token already in it.
    answer = tok.tokenize_str("yes please")
    handed = Sequence([*prompt, answer[0]], SamplingParams(grammar=grammar), 16, num_prompt_tokens=3)
    after_first = _allowed(masker, handed)
    assert len(answer) > 1 and answer[1] in after_first and not after_first & eos
    for t in answer[1:]:
        handed.append_token(t)
    assert _allowed(masker, handed) == eos  # the grammar is complete: only EOS may follow
    handed.truncate(len(prompt) + 1)  # tokens taken back: the matcher rolls back with them
    assert _allowed(masker, handed) == after_first


def test_a_sequence_without_a_grammar_needs_no_mask(masker):
    masker, _ = masker
    plain = Sequence([1, 2], SamplingParams(), block_size=16)
    assert masker.mask([plain], VOCAB, torch.device("cpu")) is None
    schema = json_schema_grammar({"type": "object"})
    mixed = masker.mask(
        [plain, Sequence([1, 2], SamplingParams(grammar=schema), 16)], VOCAB, torch.device("cpu")
    )
    assert mixed is not None and mixed[0].all() and not mixed[1].all()


def _walk(masker: GrammarMasker, grammar: str, text: str) -> set[int]:
    """Feed `text`'s tokens one by one, each checked against the mask; the mask after the last."""
    tok = masker.tokenizer(VOCAB)
    seq = Sequence([1, 2, 3], SamplingParams(grammar=grammar), block_size=16)
    for t in tok.tokenize_str(text):
        assert t in _allowed(masker, seq), (text, t)
        seq.append_token(t)
    return _allowed(masker, seq)


def test_thousands_of_choices_with_regex_characters_match_exactly(masker):
    """guided_choice past llguidance's 2,000 alternatives per grammar row, with characters regexes give
    a meaning: each choice is allowed whole and then only EOS; a non-choice is refused."""
    masker, _ = masker
    eos = set(masker.eos_token_ids)
    choices = [f"option number {i}" for i in range(3000)] + ["a.b|c (x)*+?", "[^$]{2} \\ #&-~"]
    grammar = choice_grammar(choices)
    for text in ("option number 2999", "a.b|c (x)*+?", "[^$]{2} \\ #&-~"):
        assert _walk(masker, grammar, text) == eos
    tok = masker.tokenizer(VOCAB)
    seq = Sequence([1, 2, 3], SamplingParams(grammar=grammar), block_size=16)
    refused = False
    for t in tok.tokenize_str("a.b c"):  # "a.b|c ..." read as a regex would allow "a.b"-something
        if t not in _allowed(masker, seq):
            refused = True
            break
        seq.append_token(t)
    assert refused


def test_admission_builds_the_matcher_or_refuses_the_request(masker, tiny_model_dirs):
    """`check` runs where a request is admitted: a model without a tokenizer refuses a grammar there
    (inside a step the error would fail the whole batch); a fine grammar keeps its matcher."""
    masker, _ = masker
    fine = Sequence([1, 2], SamplingParams(grammar=regex_grammar("[a-z]{3}")), block_size=16)
    masker.check(fine, VOCAB)
    assert fine.grammar_state is not None  # the first step reuses it
    bare = GrammarMasker(tiny_model_dirs["llama"], (2,))
    seq = Sequence([1, 2], SamplingParams(grammar=regex_grammar("[a-z]{3}")), block_size=16)
    with pytest.raises(ValueError, match="grammar needs a tokenizer"):
        bare.check(seq, 512)
