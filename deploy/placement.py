"""Which Ray nodes take which workers: `--ray-resources [ROLE=]JSON`, custom Ray resources per worker.

Ray places an actor on a node that has the resources it asks for, so the usual way to pin work to
nodes is to give those nodes a custom resource (`ray start --resources '{"decode_node": 8}'`, or a
node type's `resources:` in cluster.yaml) and ask for it. Without any, Ray is free to put every CPU
worker on one node (workers reserve no CPU, see RayBackend), and GPU workers wherever a share is free.

    --ray-resources '{"pdserve": 1}'            every worker reserves 1 `pdserve`
    --ray-resources 'decode={"decode_node": 1}' decode workers only (ROLE: prefill, decode or mixed)

A role's own resources are added to (and override, name by name) the ones given for every worker.
The amount is what each worker takes from its node's total, so it also caps the workers per node.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from deploy.base import WORKER_MODULES

EVERY_ROLE = "*"  # the key of the resources every worker asks for
# Ray sizes these through num_cpus / num_gpus (and --gpus-per-worker here), never through `resources`.
_RESERVED = ("CPU", "GPU", "memory", "object_store_memory")

RayResources = dict[str, dict[str, float]]  # EVERY_ROLE or a role -> {resource name: amount}


def parse_ray_resources(values: Sequence[str]) -> RayResources:
    """The `--ray-resources` values, validated; ValueError names the value at fault."""
    parsed: RayResources = {}
    for value in values:
        role, spec = _split_role(value)
        if role in parsed:
            raise ValueError(f"--ray-resources gives {role!r} twice; put its resources in one JSON object")
        parsed[role] = _parse_amounts(spec, value)
    return parsed


def resources_for(ray_resources: RayResources, role: str) -> dict[str, float]:
    """What one worker of `role` reserves: the resources for every worker, then its role's own."""
    return {**ray_resources.get(EVERY_ROLE, {}), **ray_resources.get(role, {})}


def _split_role(value: str) -> tuple[str, str]:
    text = value.strip()
    if text.startswith("{"):
        return EVERY_ROLE, text
    role, sep, spec = text.partition("=")
    if not sep or role not in WORKER_MODULES:
        raise ValueError(
            f"--ray-resources must be JSON or ROLE=JSON with ROLE in {tuple(WORKER_MODULES)}, got {value!r}"
        )
    return role, spec


def _parse_amounts(spec: str, value: str) -> dict[str, float]:
    try:
        amounts = json.loads(spec)
    except json.JSONDecodeError as e:
        raise ValueError(f"--ray-resources {value!r} is not valid JSON: {e}") from None
    if not isinstance(amounts, dict) or not amounts:
        raise ValueError(f"--ray-resources needs a non-empty JSON object of amounts, got {value!r}")
    for name, amount in amounts.items():
        if not name or name in _RESERVED:
            raise ValueError(
                f"--ray-resources cannot name {name!r}: only custom resources (GPUs: --gpus-per-worker)"
            )
        if isinstance(amount, bool) or not isinstance(amount, int | float) or not amount > 0:
            raise ValueError(f"--ray-resources amount of {name!r} must be a positive number, got {amount!r}")
    return {name: float(amount) for name, amount in amounts.items()}
