"""`python -m router`'s flags come from one table (router/flags.py): every RouterConfig field has exactly
one flag, and what the command line leaves out keeps RouterConfig's own default."""

from __future__ import annotations

import dataclasses

from router.__main__ import parse_args
from router.config import API_KEY_ENV, RouterConfig
from router.flags import ROUTER_FLAGS

NOT_FLAGS = {"curve"}  # the cluster's keys come from the environment only


def test_every_router_config_field_has_one_flag() -> None:
    fields = [f.name for f in dataclasses.fields(RouterConfig)]
    assert sorted(ROUTER_FLAGS.fields) == sorted(set(fields) - NOT_FLAGS)


def test_flags_left_out_keep_the_config_defaults(monkeypatch) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    config, log_level = parse_args(["--model", "/m"])
    assert config == RouterConfig(model="/m") and log_level == "info"


def test_every_flag_reaches_its_field(monkeypatch) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    values = {
        "served_model_name": "served",
        "host": "::1",
        "port": 0,
        "inbox_host": "10.0.0.2",
        "inbox_port": 5000,
        "routing": "round_robin",
        "balance_threshold_tokens": 7,
        "disagg": "auto",
        "disagg_stall_weight": 0.5,
        "generation_config": "vllm",
        "kv_probe_mb": 0.0,
        "kv_probe_min_gbps": 1.5,
        "request_timeout": 9.0,
        "heartbeat_timeout": 2.0,
        "max_retries": 0,
        "snapshot_retry_interval": 0.5,
        "block_size": 32,
        "max_running_requests": 3,
        "admission_wait_s": 0.25,
        "stream_interval": 4,
        "max_body_bytes": 100,
        "ready_file": "/tmp/ready.json",
        "api_key": "k3y",
        "protect_status": True,
        "disable_uvicorn_access_log": True,
        "front": 1,
        "reuse_port": True,
        "fronts_dir": "/tmp/fronts",
    }
    assert set(values) | {"model"} == set(ROUTER_FLAGS.fields)
    config, _ = parse_args(ROUTER_FLAGS.argv({"model": "/m", **values}))
    assert config == RouterConfig(model="/m", **values)
    assert parse_args(["--model", "/m", "--request-timeout", "0"])[0].request_timeout is None  # no limit
