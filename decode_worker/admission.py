"""From a command (DecodeRequest or GenerateRequest) to the Sequence the engine runs."""

from __future__ import annotations

from common.core.sequence import Sequence
from common.llm_engine import LLMEngine
from common.wire.blocks import blocks_for
from common.wire.messages import DecodeRequest, GenerateRequest


def sequence_from_request(engine: LLMEngine, req: DecodeRequest | GenerateRequest) -> Sequence:
    """Raises ValueError (naming the problem) for a request this engine cannot run.

    GenerateRequest: the prompt, computed here. DecodeRequest: the prompt plus the first token
    (sampled by the prefill worker), with the prompt/completion boundary after the prompt, so
    max_tokens, penalties and positions count the first token as the first completion token."""
    if isinstance(req, GenerateRequest):
        return engine.make_sequence(req.prompt_token_ids, req.sampling, req.request_id)
    token_ids = [*req.prompt_token_ids, req.first_token_id]
    return engine.make_sequence(token_ids, req.sampling, req.request_id, len(req.prompt_token_ids))


def transferable(req: DecodeRequest, block_size: int) -> bool:
    """The published blocks cover exactly the prompt (else the transfer is skipped: recompute)."""
    return req.handoff.num_blocks == blocks_for(len(req.prompt_token_ids), block_size)
