"""A cluster's greedy answers against the offline engine's, and where they part when they differ.

The OpenAI API returns text, not token ids, so an answer is compared through its text, its token count
and its finish reason. When the texts differ, the place is the first offline token the cluster's text
does not go on with, and the offline engine is asked for its top tokens there: which of them the
cluster took, and by how much (logprob) the offline engine preferred its own, tells a rounding
near-tie (a lead of ~1e-6 in float32) from a fault (a large lead, or a token outside its top 5).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from common import LLM
from common.wire.sampling_params import SamplingParams
from tests.integration.test_cluster import expected


@dataclass(frozen=True)
class ClusterAnswer:
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int

    @classmethod
    def from_chat(cls, data: dict) -> ClusterAnswer:
        """From a /v1/chat/completions response body (one choice)."""
        choice, usage = data["choices"][0], data["usage"]
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        text = choice["message"]["content"] or ""
        return cls(text, choice["finish_reason"], usage["prompt_tokens"], usage["completion_tokens"], cached)


class OfflineReference:
    """The offline engine on this machine, one per dtype with the clusters' engine flags, and its greedy
    answers to `prompts` (token ids), asked in `rounds` (lists of prompt indices, one `generate` each,
    as the cluster is asked); answers are computed once per dtype."""

    def __init__(
        self, model: str, tokenizer, prompts: list[list[int]], rounds, max_tokens: int, engine: dict
    ) -> None:
        self.model, self.tokenizer, self.prompts = model, tokenizer, prompts
        self.rounds, self.max_tokens, self.engine = rounds, max_tokens, engine
        self._llms: dict[str, LLM] = {}
        self._answers: dict[str, list[dict]] = {}

    def llm(self, dtype: str) -> LLM:
        if dtype not in self._llms:
            self._llms[dtype] = LLM(self.model, dtype=dtype, **self.engine)
        return self._llms[dtype]

    def answers(self, dtype: str) -> list[dict]:
        if dtype not in self._answers:
            got: dict[int, dict] = {}
            for batch in self.rounds:
                ids = [self.prompts[i] for i in batch]
                outs = expected(self.llm(dtype), self.tokenizer, ids, self.max_tokens)
                got.update(zip(batch, outs, strict=True))
            self._answers[dtype] = [got[i] for i in range(len(self.prompts))]
        return self._answers[dtype]

    def top_tokens(self, dtype: str, ids: list[int], k: int = 5) -> dict[int, float]:
        """The k likeliest next tokens after `ids` -> their logprobs, best first."""
        params = SamplingParams(temperature=0, max_tokens=1, logprobs=k)
        return dict(self.llm(dtype).generate([ids], params, use_tqdm=False)[0]["logprobs"][0].top)


@dataclass(frozen=True)
class Divergence:
    prompt: int
    detail: str
    # The offline engine's logprob of its own token minus that of the cluster's token where they part
    # (None: unknown, e.g. the cluster's token is not in the offline top 5, so no near-tie).
    lead: float | None = None


def divergences(
    answers: Sequence[ClusterAnswer], ref: OfflineReference, dtype: str, names: Sequence[str]
) -> list[Divergence]:
    """One Divergence per answer that is not the offline engine's, in prompt order."""
    wants = ref.answers(dtype)
    found = [divergence(i, names[i], answers[i], wants[i], ref, dtype) for i in range(len(wants))]
    return [d for d in found if d is not None]


def divergence(
    i: int, name: str, got: ClusterAnswer, want: dict, ref: OfflineReference, dtype: str
) -> Divergence | None:
    prompt, ids = ref.prompts[i], want["token_ids"]
    if got.prompt_tokens != len(prompt):
        return Divergence(
            i, f"{name}: the router saw {got.prompt_tokens} prompt tokens, offline {len(prompt)}"
        )
    if got.text != want["text"]:
        return parting(i, name, got, want, ref, dtype)
    if (got.completion_tokens, got.finish_reason) == (len(ids), want["finish_reason"]):
        return None
    return Divergence(
        i,
        f"{name}: same text, but {got.completion_tokens} tokens ({got.finish_reason}) "
        f"against offline {len(ids)} ({want['finish_reason']})",
    )


def parting(
    i: int, name: str, got: ClusterAnswer, want: dict, ref: OfflineReference, dtype: str
) -> Divergence:
    """Where the texts part: the offline token there, the cluster's (from the offline top 5), the lead."""
    tok, ids = ref.tokenizer, want["token_ids"]
    p = agreed_tokens(got.text, ids, tok.decode)
    if p == len(ids) and want["finish_reason"] == "stop":
        p -= 1  # the offline answer ended with EOS (no text) there; the cluster's went on
    ours = ids[p] if p < len(ids) else None
    top = ref.top_tokens(dtype, ref.prompts[i] + ids[:p])
    theirs = cluster_token(got.text, ids[:p], top, ours, tok)
    lead = top[ours] - top[theirs] if theirs is not None and ours in top else None
    at = max(0, len(tok.decode(ids[:p])) - 30)
    detail = (
        f"{name} differs at completion token {p}: offline {show(tok, ours)}, cluster {show(tok, theirs)}; "
        f"offline logprob lead {lead if lead is None else f'{lead:.3g}'}; "
        f"offline top {[(show(tok, t), round(lp, 6)) for t, lp in top.items()]}\n"
        f"    cluster: ...{got.text[at : at + 80]!r}\n"
        f"    offline: ...{want['text'][at : at + 80]!r}"
    )
    return Divergence(i, detail, lead)


def agreed_tokens(text: str, ids: list[int], decode) -> int:
    """How many leading offline tokens the cluster's text goes on with (a token that ends inside a
    multi-byte character is judged together with the next one)."""
    agreed = 0
    for j in range(1, len(ids) + 1):
        piece = decode(ids[:j])
        if text.startswith(piece):
            agreed = j
        elif not piece.endswith("\ufffd"):
            break
    return agreed


def cluster_token(text: str, prefix: list[int], top: dict[int, float], ours: int | None, tok) -> int | None:
    """Which of the offline top tokens after `prefix`, other than `ours`, the cluster's text goes on with
    (an EOS when the cluster's text ends there)."""
    base = tok.decode(prefix)
    for token in top:
        extended = tok.decode([*prefix, token])
        ends = token in tok.eos_token_ids and text == base
        if token != ours and (ends or (extended != base and text.startswith(extended))):
            return token
    return None


def show(tok, token: int | None) -> str:
    return "none" if token is None else f"{token} {tok.token_text(token)!r}"
