"""`--ray-resources`: which custom Ray resources each worker reserves, parsed from the command line
through the launcher, validated there, and carried into every worker's spec."""

from __future__ import annotations

import pytest

from common.tools.default_model import prepare_default_model
from deploy.launch_args import parse_args
from deploy.placement import EVERY_ROLE, parse_ray_resources, resources_for
from deploy.plan import LaunchPlan, worker_specs


def test_every_worker_and_per_role_resources_merge_role_last() -> None:
    parsed = parse_ray_resources(['{"pdserve": 1, "zone_a": 0.5}', 'decode={"zone_a": 1, "big": 2}'])
    assert parsed == {EVERY_ROLE: {"pdserve": 1.0, "zone_a": 0.5}, "decode": {"zone_a": 1.0, "big": 2.0}}
    assert resources_for(parsed, "prefill") == {"pdserve": 1.0, "zone_a": 0.5}
    assert resources_for(parsed, "decode") == {"pdserve": 1.0, "zone_a": 1.0, "big": 2.0}
    assert resources_for({}, "mixed") == {}


@pytest.mark.parametrize(
    "values, message",
    [
        (["gpu_node"], "JSON or ROLE=JSON"),
        (['router={"a": 1}'], "JSON or ROLE=JSON"),
        (['decode={"a": 1'], "not valid JSON"),
        (["decode=[1]"], "non-empty JSON object"),
        (["{}"], "non-empty JSON object"),
        (['{"GPU": 1}'], "only custom resources"),
        (['{"a": 0}'], "positive number"),
        (['{"a": true}'], "positive number"),
        (['decode={"a": 1}', 'decode={"b": 1}'], "twice"),
    ],
)
def test_bad_values_are_refused_naming_the_flag(values: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message) as e:
        parse_ray_resources(values)
    assert "--ray-resources" in str(e.value)


def test_resources_reach_each_role_spec_through_the_launcher() -> None:
    model = str(prepare_default_model(progress=False))
    argv = ["--model", model, "--prefill", "1", "--decode", "2", "--ray-resources", '{"pool": 1}']
    plan = parse_args([*argv, "--ray-resources", 'decode={"gpu_node": 1}'])
    specs = {s.worker_id: s.resources for s in worker_specs(plan, "tcp://127.0.0.1:5000", num_gpus=0)}
    assert specs == {
        "prefill-0": {"pool": 1.0},
        "decode-0": {"pool": 1.0, "gpu_node": 1.0},
        "decode-1": {"pool": 1.0, "gpu_node": 1.0},
    }
    assert all(s.resources == {} for s in worker_specs(LaunchPlan(model), "tcp://h:1", num_gpus=0))


def test_local_backend_refuses_ray_resources(capsys) -> None:
    with pytest.raises(ValueError, match="ray_resources"):
        LaunchPlan("/m", backend="local", ray_resources={"decode": {"a": 1.0}})
    model = str(prepare_default_model(progress=False))
    with pytest.raises(SystemExit) as exc:
        parse_args(["--model", model, "--backend", "local", "--ray-resources", '{"a": 1}'])
    assert exc.value.code == 2 and "ray_resources" in capsys.readouterr().err
