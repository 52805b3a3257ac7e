"""The offline batch API: `LLM(path).generate(prompts, sampling_params)` and, for conversations,
`LLM(path).chat(messages, sampling_params)` (vLLM's names)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from common.config import EngineConfig
from common.core.batch import SeqUpdate
from common.core.sequence import Sequence
from common.llm_engine import LLMEngine
from common.runner.grammar import grammar_failure
from common.tokenizer import load_tokenizer
from common.wire.detokenizer import Decoder, IncrementalDetokenizer
from common.wire.sampling_params import SamplingParams
from common.wire.structured_output import check_grammar


class _StopStrings:
    """Stop strings of one sequence, checked incrementally as its tokens arrive (the router's rule:
    not before `min_tokens`; the text ends before the stop string; the output ends at the token that
    completed it)."""

    def __init__(self, decoder: Decoder, params: SamplingParams) -> None:
        # No prompt context: the cut text is then a prefix of what a full decode of the tokens gives.
        self.detok = IncrementalDetokenizer(
            decoder, stop=params.stop, include_stop=params.include_stop_str_in_output
        )
        self.min_tokens = params.min_tokens
        self.num_tokens = 0  # completion tokens seen; when stopped, those the output keeps

    @property
    def stopped(self) -> bool:
        return self.detok.stopped is not None

    def add(self, token: int) -> bool:
        """Feed the next completion token; True if it completes a stop string."""
        self.num_tokens += 1
        return self.detok.add([token], check_stop=self.num_tokens >= self.min_tokens).stop is not None


@dataclass
class _Pending:
    """Book-keeping for one prompt's n samples."""

    index: int
    seqs: list[Sequence] = field(default_factory=list)
    stops: dict[int, _StopStrings] = field(default_factory=dict)  # seq_id -> its stop strings, if any


class LLM:
    """Loads the model (this constructor does the I/O: it is the user-facing entry point)."""

    def __init__(self, model: str, **engine_kwargs) -> None:
        unknown = set(engine_kwargs) - EngineConfig.field_names()
        if unknown:
            raise ValueError(f"unknown engine option(s): {', '.join(sorted(unknown))}")
        self.config = EngineConfig(model=model, **engine_kwargs)
        self.engine = LLMEngine.from_config(self.config)
        self.tokenizer = load_tokenizer(model)

    def close(self) -> None:
        """Release the engine's worker processes (tensor parallelism); the LLM is unusable afterwards."""
        self.engine.close()

    def generate(
        self,
        prompts: list[str | list[int] | dict] | str,
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[dict]:
        """Generate for every prompt (a string, token ids, or vLLM's `{"prompt": text}` /
        `{"prompt_token_ids": ids}`); results in input order as {"text", "token_ids", "finish_reason"}
        (+ "outputs" if n>1).

        "text" is None when the model directory has no tokenizer (token-id prompts only). An answer
        whose grammar could not be followed to its end (its matcher failed mid-answer) has
        "finish_reason" "error" and says why in "error", as a worker answers the router with an error.
        """
        prompts, params = self._normalise(prompts, sampling_params)
        self._check_grammars(params)
        token_lists = [self._encode(p, i) for i, p in enumerate(prompts)]
        seqs_per_prompt = [
            self._make_seqs(ids, sp, i) for i, (ids, sp) in enumerate(zip(token_lists, params, strict=True))
        ]
        pending = [_Pending(i, seqs, self._stop_strings(seqs)) for i, seqs in enumerate(seqs_per_prompt)]
        by_id = {s.seq_id: p for p in pending for s in p.seqs}
        for p in pending:
            for seq in p.seqs:
                self.engine.scheduler.add(seq)
        self._run(by_id, sum(len(p.seqs) for p in pending), use_tqdm)
        return [self._result(p) for p in pending]

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = True,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: dict | None = None,
    ) -> list[dict]:
        """vLLM's `LLM.chat`: one conversation (a list of messages) or a list of them, each rendered by
        the model's chat template (transformers' `apply_chat_template`, the rendering the router's own
        is tested against) and generated as `generate` does; results in input order."""
        if self.tokenizer is None:
            raise ValueError("messages need a chat template; the model directory has no tokenizer")
        if continue_final_message and add_generation_prompt:
            raise ValueError("continue_final_message needs add_generation_prompt=False")
        single = isinstance(messages, list) and bool(messages) and isinstance(messages[0], dict)
        conversations = [messages] if single else messages
        if not isinstance(conversations, list) or not conversations:
            raise ValueError("messages must be a list of messages or a list of conversations")
        prompts: list[str | list[int]] = []
        for i, conversation in enumerate(conversations):
            if not isinstance(conversation, list) or not conversation:
                raise ValueError(f"messages[{i}] must be a non-empty list of messages")
            if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in conversation):
                raise ValueError(f"messages[{i}]: every message must be a dict with a 'role'")
            text = self.tokenizer.apply_chat_template(
                conversation,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                **(chat_template_kwargs or {}),
            )
            prompts.append(self.tokenizer.encode(text, add_special_tokens=False))  # the template wrote them
        return self.generate(prompts, sampling_params, use_tqdm)

    # ---- helpers -------------------------------------------------------------------------------
    def _normalise(self, prompts, sampling_params) -> tuple[list, list[SamplingParams]]:
        if isinstance(prompts, str | dict) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]
        if not isinstance(prompts, list):
            raise ValueError("prompts must be a string, a token-id list, a prompt dict, or a list of those")
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            return prompts, [sampling_params] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(f"sampling_params has {len(sampling_params)} entries for {len(prompts)} prompts")
        return prompts, list(sampling_params)

    def _check_grammars(self, params: list[SamplingParams]) -> None:
        for i, sp in enumerate(params):
            if sp.grammar is None:
                continue
            if self.tokenizer is None:
                raise ValueError(
                    f"sampling_params[{i}].grammar needs a tokenizer; the model directory has none"
                )
            check_grammar(sp.grammar, f"sampling_params[{i}].grammar")

    def _encode(self, prompt: str | list[int] | dict, index: int) -> list[int]:
        if isinstance(prompt, dict):  # vLLM's TextPrompt / TokensPrompt forms
            prompt = _prompt_of(prompt, index)
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(f"prompts[{index}] is text but the model directory has no tokenizer")
            ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, list):
            ids = prompt
        else:
            raise ValueError(f"prompts[{index}] must be a string or a list of token ids")
        try:
            self.engine.validate_token_ids(ids)
        except ValueError as exc:
            raise ValueError(f"prompts[{index}]: {exc}") from exc
        return ids

    def _make_seqs(self, ids: list[int], params: SamplingParams, index: int) -> list[Sequence]:
        seqs = []
        for k in range(params.n):
            sp = params if params.n == 1 or params.seed is None else _with_seed(params, params.seed + k)
            try:
                seq = self.engine.make_sequence(ids, sp, f"{index}-{k}")
                self.engine.prepare_grammar(seq)  # a refused grammar raises here, before anything runs
                seqs.append(seq)
            except ValueError as exc:
                raise ValueError(f"prompts[{index}]: {exc}") from exc
        return seqs

    def _run(self, by_id: dict[int, _Pending], total: int, use_tqdm: bool) -> None:
        bar = tqdm(total=total, desc="Generating", dynamic_ncols=True, disable=not use_tqdm)
        prefill_tps = decode_tps = 0.0
        while self.engine.has_unfinished:
            t0 = time.perf_counter()
            result = self.engine.step()
            dt = max(time.perf_counter() - t0, 1e-9)
            if result.num_prefill_tokens:
                prefill_tps = result.num_prefill_tokens / dt
            elif result.num_decode_tokens:
                decode_tps = result.num_decode_tokens / dt
            bar.set_postfix(prefill=f"{prefill_tps:.0f}tok/s", decode=f"{decode_tps:.0f}tok/s")
            for update in result.updates:
                if self._apply(by_id[update.seq.seq_id], update):
                    bar.update(1)
        bar.close()

    def _stop_strings(self, seqs: list[Sequence]) -> dict[int, _StopStrings]:
        if self.tokenizer is None:  # no text, so no stop strings (token-id prompts only)
            return {}
        return {
            s.seq_id: _StopStrings(self.tokenizer, s.sampling_params) for s in seqs if s.sampling_params.stop
        }

    def _apply(self, pending: _Pending, update: SeqUpdate) -> bool:
        """Check one new token against the stop strings; True when this update ends the sequence.

        A stop string ends the output like the router's does: the engine is told to abort the
        request (as the router sends `Abort`), and the result reports "stop"."""
        stops = pending.stops.get(update.seq.seq_id)
        if stops is None:
            return update.finished
        if stops.stopped:  # tokens of an accepted draft run past the stop string
            return False
        if stops.add(update.new_token_id):
            if not update.finished:
                self.engine.abort([update.seq.request_id])
            return True
        return update.finished

    def _result(self, pending: _Pending) -> dict:
        outs = []
        for seq in pending.seqs:
            ids, text, reason = seq.completion_token_ids, None, _reason(seq)
            stops = pending.stops.get(seq.seq_id)
            if stops is not None and stops.stopped:
                ids, text, reason = ids[: stops.num_tokens], stops.detok.text, "stop"
            elif self.tokenizer is not None:
                visible = seq.sampling_params.visible_tokens(ids, reason)
                text = self.tokenizer.decode(visible, skip_special_tokens=True)
            out = {"text": text, "token_ids": ids, "finish_reason": reason}
            if (failure := grammar_failure(seq)) is not None:
                out |= {"finish_reason": "error", "error": f"grammar could not be followed: {failure}"}
            if seq.sampling_params.logprobs is not None:
                out["logprobs"] = seq.logprobs[: len(ids)]
            outs.append(out)
        first = dict(outs[0])
        if len(outs) > 1:
            first["outputs"] = outs
        return first


def _prompt_of(prompt: dict, index: int) -> str | list[int]:
    """The text of `{"prompt": ...}` or the ids of `{"prompt_token_ids": ...}` (exactly one of them)."""
    keys = set(prompt)
    if keys not in ({"prompt"}, {"prompt_token_ids"}):
        wanted = "exactly one of 'prompt' and 'prompt_token_ids'"
        raise ValueError(f"prompts[{index}] as a dict takes {wanted}, got {sorted(keys)}")
    if "prompt" in prompt and not isinstance(prompt["prompt"], str):
        raise ValueError(f"prompts[{index}]['prompt'] must be a string")
    if "prompt_token_ids" in prompt and not isinstance(prompt["prompt_token_ids"], list):
        raise ValueError(f"prompts[{index}]['prompt_token_ids'] must be a list of token ids")
    return prompt.get("prompt", prompt.get("prompt_token_ids"))


def _with_seed(params: SamplingParams, seed: int) -> SamplingParams:
    data = params.to_dict()
    data["seed"] = seed
    return SamplingParams.from_dict(data)


def _reason(seq: Sequence) -> str | None:
    return seq.finish_reason.value if seq.finish_reason is not None else None
