"""Engine core shared by every role.

`from common import LLM, SamplingParams` gives the offline batch API. The heavy names are imported
lazily so that torch-free users (the router) can import `common.wire.hashing` or `common.wire.messages`
without pulling in torch.
"""

from typing import TYPE_CHECKING

__all__ = ["LLM", "SamplingParams", "EngineConfig"]

if TYPE_CHECKING:
    from common.config import EngineConfig
    from common.llm import LLM
    from common.wire.sampling_params import SamplingParams


def __getattr__(name: str):
    if name == "LLM":
        from common.llm import LLM

        return LLM
    if name == "SamplingParams":
        from common.wire.sampling_params import SamplingParams

        return SamplingParams
    if name == "EngineConfig":
        from common.config import EngineConfig

        return EngineConfig
    raise AttributeError(f"module 'common' has no attribute {name!r}")
