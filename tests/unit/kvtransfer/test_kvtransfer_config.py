"""Configuration, transport choice, registry, cache checks and the cache layout on the wire (no sockets)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.wire.codec import encode
from common.wire.handoff import HandOff
from common.wire.kv_messages import BlockLayout, KVFetch, decode_kv
from kvtransfer import KVTransferConfig, create_receiver, create_sender, resolve_transport
from kvtransfer.base import check_kv_cache
from kvtransfer.layout import CacheLayout, gather, scatter

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    "device_type, same_host, expected",
    [("cuda", True, "ipc"), ("cuda", False, "nccl"), ("cpu", True, "tcp"), ("cpu", False, "tcp")],
)
def test_resolve_auto(device_type, same_host, expected):
    assert resolve_transport("auto", device_type, same_host) == expected


@pytest.mark.parametrize("transport", ["tcp", "ipc", "nccl"])
def test_resolve_explicit_is_kept(transport):
    assert resolve_transport(transport, "cpu", False) == transport


@pytest.mark.parametrize(
    "args, field", [(("udp", "cpu", True), "transport"), (("auto", "tpu", True), "device_type")]
)
def test_resolve_rejects_unknown(args, field):
    with pytest.raises(ValueError, match=field):
        resolve_transport(*args)


def test_config_defaults_are_valid():
    config = KVTransferConfig()
    assert config.transport == "tcp" and config.host == "127.0.0.1"


@pytest.mark.parametrize(
    "field, value",
    [
        ("transport", "udp"),
        ("dist_backend", "mpi"),
        ("host", None),
        ("advertise_host", "0.0.0.0"),
        ("fetch_timeout_s", 0),
        ("fetch_timeout_s", float("inf")),
        ("lease_s", -1.0),
        ("lease_s", "5"),
        ("poll_interval_s", float("nan")),
        ("chunk_bytes", 0),
        ("chunk_bytes", True),
    ],
)
def test_config_rejects_bad_field(field, value):
    with pytest.raises(ValueError, match=field):
        KVTransferConfig(**{field: value})


def test_registry_rejects_auto_unknown_and_mismatched_config():
    cache = torch.zeros(2, 1, 4, 2, 1, 4)
    with pytest.raises(ValueError, match="resolve_transport"):
        create_sender("auto", cache)
    with pytest.raises(ValueError, match="transport"):
        create_receiver("smoke-signals", cache)
    with pytest.raises(ValueError, match="config.transport"):
        create_sender("tcp", cache, KVTransferConfig(transport="nccl"))


def test_ipc_needs_a_cuda_cache():
    with pytest.raises(ValueError, match="CUDA"):
        create_sender("ipc", torch.zeros(2, 1, 4, 2, 1, 4))


@pytest.mark.parametrize(
    "cache",
    [
        torch.zeros(2, 1, 4, 2, 4),
        torch.zeros(3, 1, 4, 2, 1, 4),
        torch.zeros(2, 1, 4, 4, 2, 3).transpose(3, 4),
        [1],
    ],
    ids=["5d", "not-k-and-v", "non-contiguous", "not-a-tensor"],
)
def test_kv_cache_contract_is_checked(cache):
    with pytest.raises(ValueError, match="kv_cache"):
        check_kv_cache(cache)


def test_constructors_do_no_io_and_close_is_safe_unstarted():
    cache = torch.zeros(2, 1, 4, 2, 1, 4)
    sender, receiver = create_sender("tcp", cache), create_receiver("tcp", cache)
    with pytest.raises(RuntimeError):
        sender.address  # noqa: B018 - the property raises
    with pytest.raises(RuntimeError):
        sender.publish("r", [0])
    with pytest.raises(RuntimeError):
        receiver.fetch(HandOff("tcp", "tcp://127.0.0.1:9", "r", 1, 1, 1), [0])
    sender.close()
    receiver.close()
    sender.close()  # idempotent


def test_importing_the_package_loads_no_transport():
    code = (
        "import sys, kvtransfer\n"
        "heavy = ('kvtransfer.tcp', 'kvtransfer.ipc', 'kvtransfer.nccl', 'zmq')\n"
        "loaded = [m for m in heavy if m in sys.modules]\n"
        "assert not loaded, loaded\n"
        "import torch\n"
        "assert not torch.cuda.is_initialized()\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


def test_layout_mismatch_names_the_difference():
    bf16 = CacheLayout("bfloat16", 2, 16, 8, 128)
    assert bf16.mismatch(bf16) is None
    assert "dtype mismatch" in bf16.mismatch(CacheLayout("float16", 2, 16, 8, 128))
    assert "block shape mismatch" in bf16.mismatch(CacheLayout("bfloat16", 2, 16, 8, 64))
    assert CacheLayout.from_wire(bf16.to_wire()) == bf16
    assert bf16.block_bytes == 2 * 2 * 16 * 8 * 128 * 2


def test_a_fetch_carries_the_layout_the_sender_checks():
    layout = CacheLayout("float32", 2, 4, 1, 8)
    fetch = KVFetch("r", 3, 7, layout.to_wire(), 2.5, pair="p" * 8)
    parsed = decode_kv(encode(fetch))
    assert isinstance(parsed, KVFetch) and CacheLayout.from_wire(parsed.layout) == layout
    with pytest.raises(ValueError, match="dtype 'x'"):
        CacheLayout.from_wire(BlockLayout("x", [2, 4, 1, 8]))


@pytest.mark.parametrize(
    ("dtype", "head_dim"),
    [
        (torch.bfloat16, 64),
        (torch.float32, 3),
        (torch.float16, 6),
        (torch.float8_e4m3fn, 16),
        (torch.float64, 2),
    ],
)
def test_gather_and_scatter_move_the_blocks_bytes_exactly(dtype, head_dim):
    """Whether they move 64-bit words (a block row of whole words) or the cache's own elements, gather
    and scatter move exactly the bytes of the blocks asked for, in order, and nothing else."""
    cache = torch.randn(2, 3, 10, 3, 1, head_dim).to(dtype)  # blocks of 3 tokens: some rows not whole words
    raw = cache.view(torch.uint8).view(6, 10, -1)
    src, dst = torch.tensor([7, 2, 5]), torch.tensor([0, 9, 1])
    blocks = gather(cache, src)
    assert blocks.dtype == dtype and blocks.shape[:2] == (6, 3)
    assert torch.equal(blocks.view(torch.uint8).view(6, 3, -1), raw[:, src])
    target = torch.zeros_like(cache)
    scatter(target, dst, blocks)
    written = target.view(torch.uint8).view(6, 10, -1)
    assert torch.equal(written[:, dst], raw[:, src])
    untouched = [b for b in range(10) if b not in dst.tolist()]
    assert not written[:, untouched].any()
