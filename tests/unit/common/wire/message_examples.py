"""One valid example of every wire message (tests/unit/common/wire/test_messages.py checks that none is
missing): the round-trip and fuzz tests of common/wire start from these."""

from __future__ import annotations

from common.wire import cache_messages as cache
from common.wire import kv_messages as kv
from common.wire import messages as m
from common.wire import probe_messages as probe
from common.wire.handoff import HandOff, IpcExport
from common.wire.hashing import probe_hash
from common.wire.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from common.wire.logprobs import TokenLogprob
from common.wire.sampling_params import FinishReason, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=4)
TCP_HANDOFF = HandOff("tcp", "tcp://127.0.0.1:5002", "r1", 5, 2**63 - 1, 2)
IPC_HANDOFF = HandOff(
    "ipc",
    "tcp://h:2",
    "kvprobe-1",
    5,
    9,
    2,
    ipc=IpcExport(77, 1.7e9, {"handle": b"\x00"}, [4, 0], [3, None], None),
)
LAYOUT = kv.BlockLayout("bfloat16", [2, 16, 4, 64])
BINDING = kv.KVBinding(5, 9, [2**64 - 1, None])

EXAMPLES: list[m.Message] = [
    m.WorkerRegister(
        worker_id="prefill-0",
        role="prefill",
        host="node1",
        pid=123,
        command_addr="tcp://127.0.0.1:5000",
        events_addr="tcp://127.0.0.1:5001",
        kv_endpoint={"transport": "tcp", "addr": "tcp://127.0.0.1:5002"},
        block_size=16,
        probe_hash=probe_hash(16),
        num_kv_blocks=1000,
        max_model_len=8192,
        max_num_batched_tokens=4096,
        model_name="smol",
        node_id="a1b2c3",
    ),
    m.WorkerHeartbeat("decode-0", 10, 20, 1, 2, 300, 1700000000.5),
    m.PrefillRequest("r1", [1, 2, 3], GREEDY, "decode-0", "tcp://h:1", None),
    m.GenerateRequest(
        "r1",
        [1, 2, 3],
        SamplingParams(stop=["x"], seed=2**63 - 1, logprobs=2, logit_bias={7: -100, 2: 1.5}),
        9.5,
    ),
    m.DecodeRequest("r1", [1, 2, 3], 7, GREEDY, TCP_HANDOFF, "prefill-0", 12.5),
    m.TokenOutput("r1", "prefill-0", 0, [7], None, 3, 0),
    m.TokenBatch("decode-0", ["r1", "r2"], [3, 1], [[8], [9, 10]], [3, 40]),
    m.TokenOutput(
        "r1",
        "decode-0",
        1,
        [8, 9],
        FinishReason.STOP,
        3,
        0,
        logprobs=[TokenLogprob(-0.1, ((8, -0.1),)), TokenLogprob(float("-inf"))],
    ),
    m.RequestFailed("r1", "decode-0", "out of blocks", True),
    m.RequestFailed("r2", "decode-0", "grammar is invalid for this model: too many items", False, True),
    m.Abort("r1"),
    cache.KVEventBatch(
        "prefill-0",
        1,
        [
            BlockStored((1, 2**64 - 1), None),
            BlockStored((3,), 2**64 - 1),
            BlockRemoved((1,)),
            AllBlocksCleared(),
        ],
    ),
    cache.SnapshotRequest("prefill-0"),
    cache.Snapshot("prefill-0", 0, [5, 6]),
    probe.KVProbeRequest("kvprobe-1-prefill-0-decode-0", "decode-0", "tcp://h:1", 32 << 20),
    probe.KVProbe("kvprobe-1", "prefill-0", IPC_HANDOFF),
    probe.KVProbeResult("kvprobe-1", "prefill-0", "decode-0", "tcp", 1 << 20, 0.01),
    probe.KVProbeResult("kvprobe-2", "prefill-0", "decode-0", "nccl", 0, 0.0, "timed out"),
    m.Shutdown(),
    kv.KVFetch("r1", 1, 5, LAYOUT, 30.0, pair="a" * 32, drop_pairs=["b" * 32]),
    kv.KVAck("r1", 1),
    kv.KVError("r1", 0, "no such publication", pair_broken=True),
    kv.KVCopied(["r1", "r2"]),
    kv.KVData("r1", 1, 0, 4, True, BINDING),
    kv.KVSums("r1", 1, 4, [-(2**63), 7]),
    kv.KVReady("r1", 2, 4096, b"\x01" * 16, BINDING),
]
