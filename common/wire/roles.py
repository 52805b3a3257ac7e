"""What an engine (and so a worker) does: prefill and decode in one place, or one half of the pair.

Part of the wire contract: registration and hand-off messages name a worker's role.
"""

from __future__ import annotations

from typing import Literal, get_args

Role = Literal["mixed", "prefill", "decode"]
ROLES: tuple[Role, ...] = get_args(Role)
