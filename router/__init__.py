"""pdserve router: OpenAI-compatible HTTP front end, global prefix index, worker selection.

The router never imports torch (nor transformers): tokenization uses `tokenizers` + jinja2.
Entry points: `python -m router --model PATH ...` (see router/__main__.py) and, in-process,
`router.server.build_router(RouterConfig(...)) -> (app, router)`.

WORKER PROTOCOL (messages are the dataclasses of `common/messages.py`, msgpack-encoded with
`common.messages.encode`, one message per ZMQ frame, no multipart)

Sockets
- Router inbox: ONE ZMQ PULL socket bound by the router (address in the ready file / READY line,
  e.g. "tcp://10.0.0.1:41234"). Every worker connects a PUSH socket to it and sends
  WorkerRegister, WorkerHeartbeat, TokenOutput, RequestFailed, Snapshot.
- Worker command socket: each worker BINDS a PULL socket at `command_addr` (an address the router
  and the prefill workers can reach; not 0.0.0.0). The router connects a PUSH socket to it and sends
  PrefillRequest (prefill workers), Abort, SnapshotRequest, Shutdown. Prefill workers also push
  DecodeRequest to a decode worker's command_addr (given in the PrefillRequest).
- Worker events socket (prefill workers): each prefill worker BINDS a PUB socket at `events_addr`
  and publishes KVEventBatch messages (no topic prefix; the router subscribes to everything).
  Decode workers send events_addr=None.

Registration and liveness
1. On start a worker sends WorkerRegister. The router accepts it only if `block_size` equals the
   cluster's (the router's --block-size, else the first accepted worker's) and
   `probe_hash == common.hashing.probe_hash(block_size)`; otherwise the worker is logged as
   rejected, listed in /health and /debug/index, and never used (nothing is sent back).
2. Re-sending an identical WorkerRegister is a harmless refresh. Workers SHOULD re-send it every few
   seconds: that is how a restarted router learns about already-running workers (heartbeats from
   unknown worker ids are ignored). A WorkerRegister with a known worker_id but a different pid or
   address is a restart: requests on the old instance fail (retryably) and its cache view is reset.
3. Heartbeats every ~0.5 s. A worker silent for --heartbeat-timeout (5 s) is DOWN: not routed to,
   its index entries dropped, its in-flight requests failed/retried; when it heartbeats again it is
   LIVE and asked for a snapshot.

Requests
- Router -> prefill: PrefillRequest(request_id, prompt_token_ids, sampling, decode_worker_id,
  decode_command_addr, deadline). `sampling` is SamplingParams.to_dict() with n == 1 always (the
  router fans out n). `deadline` is absolute Unix time (time.time()) or None; work past it may be
  dropped. Workers must honour max_tokens, min_tokens, stop_token_ids, ignore_eos and EOS (the
  model's EOS ids from its generation_config/config); STOP STRINGS ARE THE ROUTER'S JOB (workers
  ignore `stop`): when the router sees one it sends Abort.
- Prefill -> router: TokenOutput(index=0, token_ids=[first], finish_reason=None,
  num_prompt_tokens, cached_tokens = prompt tokens served from the prefix cache) as soon as the first
  token is sampled, before the KV transfer. If the first token already finishes the request (EOS /
  stop token, or max_tokens == 1) the prefill worker sends it with finish_reason set and does NOT
  involve the decode worker.
- Prefill -> decode: DecodeRequest (same request_id) on the decode worker's command socket.
- Decode -> router: TokenOutput with index = completion position of token_ids[0] (1, 2, ...;
  batching several tokens per message is allowed), finish_reason on the last message ("stop",
  "length" or "abort"; token_ids may be empty then). Report kv_transfer_bytes/seconds once (on any
  message, usually the first); the router sums them. The router orders messages by index and
  tolerates decode messages arriving before the prefill token.
- Any worker -> router: RequestFailed(request_id, worker_id, error, retryable). retryable=True means
  another worker may succeed; the router retries on other workers if no token reached the client.
- Router -> workers: Abort(request_id) to BOTH the prefill and the decode worker whenever the router
  ends a request the workers did not finish (stop string, client disconnect, deadline, failure).
  Abort must be idempotent and tolerate unknown ids (it may arrive before the DecodeRequest).
  Request ids of retries get a "~retryN" suffix; messages for unknown ids are dropped by the router.
- Router -> workers: Shutdown(reason) only when a launcher calls `ClusterClient.shutdown_workers()`.
- logprobs: when sampling["logprobs"] is k (not None), TokenOutput.logprobs has one entry per token:
  {"logprob": float, "top": [[token_id, logprob], ...]} with the k best alternatives.

Prefix-cache events (prefill workers)
- KVEventBatch(worker_id, seq, events): seq is 1 for the first batch after the process starts and
  +1 per batch. Events: stored(hashes, parent) when full blocks get their hash registered (hashes
  from common.hashing, in chain order), removed(hashes) when forgotten (evicted), cleared() when the
  whole cache is dropped. Use common.messages.stored_event / removed_event / cleared_event.
- SnapshotRequest(worker_id) -> Snapshot(worker_id, seq, hashes): all hashes currently cached, `seq`
  = the last batch seq already published and reflected (0 if none). The router asks on join, on a seq
  gap, and after a worker was down; it buffers batches meanwhile and replays those with seq > the
  snapshot's. It re-asks if no snapshot arrives within a couple of seconds.
"""
