"""From a DecodeRequest to a Sequence whose prompt KV is about to arrive."""

from __future__ import annotations

import math

from common.llm_engine import LLMEngine
from common.messages import DecodeRequest
from common.sequence import Sequence


def sequence_from_request(engine: LLMEngine, req: DecodeRequest) -> Sequence:
    """The prompt plus the first token (sampled by the prefill worker), with the prompt/completion
    boundary after the prompt, so max_tokens, penalties and positions count the first token as the
    first completion token. Raises ValueError (naming the problem) for a request this engine cannot run."""
    token_ids = [*req.prompt_token_ids, req.first_token_id]
    engine.validate_token_ids(token_ids)
    seq = Sequence(
        token_ids,
        req.sampling,
        engine.config.kvcache_block_size,
        req.request_id,
        num_prompt_tokens=len(req.prompt_token_ids),
    )
    engine.scheduler.validate(seq)
    return seq


def transferable(req: DecodeRequest, block_size: int) -> bool:
    """The sender's blocks cover exactly the prompt (else the transfer is skipped: recompute)."""
    return len(req.src_block_ids) == math.ceil(len(req.prompt_token_ids) / block_size)
