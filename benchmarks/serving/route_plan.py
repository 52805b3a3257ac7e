"""Router CPU for planning one request's route (hashing its blocks, the prefix match, the loads, the
policy and the disaggregation decision), alone, on a few cluster shapes.

    python benchmarks/serving/route_plan.py [--prompt-len 512] [--number 3000]

Prints microseconds per `RoutePlanner.plan` (least of 5 repeats) and per `WorkerRegistry.max_model_len`
(asked once more per request).
"""

from __future__ import annotations

import argparse
import random
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.serving.firehose_worker import firehose_registration  # noqa: E402
from common.wire.sampling_params import SamplingParams  # noqa: E402
from router.live_rates import LiveRates  # noqa: E402
from router.policy import make_policy  # noqa: E402
from router.prefix_index import PrefixIndex  # noqa: E402
from router.route_planner import RoutePlanner  # noqa: E402
from router.worker_registry import WorkerRegistry  # noqa: E402

SHAPES = {  # name -> (disagg mode, [(worker id, role)])
    "1 mixed": ("never", [("m0", "mixed")]),
    "1P+1D": ("always", [("p0", "prefill"), ("d0", "decode")]),
    "2P+6D auto": (
        "auto",
        [(f"p{i}", "prefill") for i in range(2)] + [(f"d{i}", "decode") for i in range(6)],
    ),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--number", type=int, default=3000)
    a = p.parse_args()
    prompt = [random.Random(0).randrange(50_000) for _ in range(a.prompt_len)]
    sampling = SamplingParams(max_tokens=128)
    for name, (disagg, workers) in SHAPES.items():
        registry = WorkerRegistry(heartbeat_timeout=1e9, disagg=disagg)
        for worker_id, role in workers:
            registry.register(firehose_registration(worker_id, f"tcp://h:{worker_id}", role), 0.0)
        planner = RoutePlanner(registry, PrefixIndex(), make_policy("prefix", 8192), LiveRates(), 1.0)
        plan = min(
            timeit.repeat(
                lambda planner=planner: planner.plan(prompt, sampling, set()), number=a.number, repeat=5
            )
        )
        mml = min(timeit.repeat(registry.max_model_len, number=a.number, repeat=5))
        print(
            f"{name:12s} plan {plan / a.number * 1e6:6.1f} us   max_model_len {mml / a.number * 1e6:5.1f} us"
        )


if __name__ == "__main__":
    main()
