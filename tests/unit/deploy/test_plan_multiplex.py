"""One GPU, `--prefill 1 --decode 1`: one multiplexed mixed worker, unless turned off or not applicable."""

from __future__ import annotations

import pytest

from deploy.plan import LaunchPlan, multiplexes, worker_specs

INBOX = "tcp://127.0.0.1:5000"


def _argv_value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_one_gpu_prefill_and_decode_become_one_multiplexed_worker() -> None:
    plan = LaunchPlan("/m", backend="local", engine={"gpu_memory_utilization": 0.8})
    specs = worker_specs(plan, INBOX, num_gpus=1)
    assert [(s.role, s.worker_id, s.module) for s in specs] == [("mixed", "mixed-0", "decode_worker")]
    argv = specs[0].argv
    assert "--pd-multiplex" in argv and _argv_value(argv, "--role") == "mixed"
    assert specs[0].num_gpus == 1.0 and _argv_value(argv, "--gpu-memory-utilization") == "0.8"


@pytest.mark.parametrize(
    "plan, num_gpus",
    [
        (LaunchPlan("/m", backend="local", pd_multiplex=False), 1),  # --no-pd-multiplex
        (LaunchPlan("/m", backend="local"), 0),  # the CPU: today's two workers
        (LaunchPlan("/m", backend="local"), 2),
        (LaunchPlan("/m", backend="local", num_decode=2), 1),
        (LaunchPlan("/m", backend="local", gpus_per_worker=0.5), 1),
        (LaunchPlan("/m", backend="local", engine={"speculative": "ngram"}), 1),
        (LaunchPlan("/m", backend="local", mps=True), 1),  # --mps: two processes sharing the SMs
    ],
)
def test_other_layouts_keep_their_workers(plan: LaunchPlan, num_gpus: int) -> None:
    assert not multiplexes(plan, num_gpus)
    specs = worker_specs(plan, INBOX, num_gpus)
    assert [s.role for s in specs] == plan.roles
    assert all("--pd-multiplex" not in s.argv for s in specs)


def test_explicit_pd_multiplex_is_for_mixed_workers() -> None:
    with pytest.raises(ValueError, match="mixed workers"):
        LaunchPlan("/m", engine={"pd_multiplex": True})
    plan = LaunchPlan("/m", num_prefill=0, num_decode=0, num_mixed=1, engine={"pd_multiplex": True})
    assert "--pd-multiplex" in worker_specs(plan, INBOX, num_gpus=1)[0].argv
