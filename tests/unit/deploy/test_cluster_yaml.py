"""deploy/cluster.yaml is a valid `ray up` file that installs pdserve and starts Ray for the launcher."""

from __future__ import annotations

import copy
import json
import re
import tomllib
from pathlib import Path

import jsonschema
import pytest
import ray
import ray.autoscaler
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

REPO_ROOT = Path(__file__).resolve().parents[3]
CLUSTER_YAML = REPO_ROOT / "deploy" / "cluster.yaml"


@pytest.fixture(scope="module")
def config() -> dict:
    return yaml.safe_load(CLUSTER_YAML.read_text())


def test_matches_rays_cluster_schema(config):
    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(config, schema)


def test_passes_rays_own_preparation_and_validation(config):
    """What `ray up` does before launching anything: merge the provider defaults, then validate."""
    validate_config(prepare_config(copy.deepcopy(config)))


def test_docker_image_carries_the_local_ray_version(config):
    # `ray up` needs the same Ray on both sides; the image tag is where the cluster's version is set.
    tag = config["docker"]["image"].rsplit(":", 1)[1]
    assert tag.startswith(f"{ray.__version__}-") and tag.endswith("-gpu")


def test_every_node_type_has_gpus(config):
    for name, node_type in config["available_node_types"].items():
        assert node_type["resources"].get("GPU", 0) >= 1, name
    assert config["head_node_type"] in config["available_node_types"]


def test_setup_installs_the_synced_repository(config):
    mounts = config["file_mounts"]
    repo_mounts = [remote for remote, local in mounts.items() if local in (".", "./")]
    assert repo_mounts, "the repository root must be synced to the nodes"
    installs = [c for c in config["setup_commands"] if "pip install" in c]
    assert any(remote in c for c in installs for remote in repo_mounts)
    # `python -m deploy.launch` and the worker modules come from that install.
    packages = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    for pkg in ("deploy*", "router*", "prefill_worker*", "decode_worker*"):
        assert pkg in packages["find"]["include"]


def test_start_commands_bring_up_a_head_that_workers_and_ray_address_auto_find(config):
    head = " ".join(config["head_start_ray_commands"])
    worker = " ".join(config["worker_start_ray_commands"])
    port = re.search(r"ray start --head .*?--port=(\d+)", head)
    assert port, head
    assert f"--address=$RAY_HEAD_IP:{port.group(1)}" in worker
    # Ray's autoscaler needs the bootstrap config on the head to add worker nodes on demand.
    assert "--autoscaling-config=~/ray_bootstrap_config.yaml" in head
