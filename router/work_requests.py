"""The command that starts one sequence on its workers: a GenerateRequest for a local route (one
worker prefills and decodes), else a PrefillRequest that names the decode target.

Every part was checked by the front already (the prompt by the request builder, the sampling by its
own constructor), so the message is built without the per-field checks of a message build (~35 us for
512 prompt ids); the worker decodes it with all of them.
"""

from __future__ import annotations

from common.wire.codec import build_checked_parts
from common.wire.messages import GenerateRequest, Message, PrefillRequest
from common.wire.sampling_params import SamplingParams
from router.route_planner import Route


def work_request(
    wire_id: str,
    prompt: list[int],
    sampling: SamplingParams,
    route: Route,
    *,
    deadline: float | None,
    log_id: str | None,
    reply_to: str | None,
    decode_command_addr: str | None,
) -> Message:
    """`reply_to`: the front the workers stream the tokens to; `decode_command_addr`: the decode
    target's command socket (a remote route only); `deadline`: wall-clock seconds, or None."""
    common = {
        "request_id": wire_id,
        "prompt_token_ids": prompt,
        "sampling": sampling,
        "deadline": deadline,
        "log_id": log_id,
        "reply_to": reply_to,
    }
    if route.local:
        return build_checked_parts(GenerateRequest, **common)
    if decode_command_addr is None:
        raise ValueError(f"a remote route to {route.decode_id} needs decode_command_addr")
    return build_checked_parts(
        PrefillRequest, decode_worker_id=route.decode_id, decode_command_addr=decode_command_addr, **common
    )
