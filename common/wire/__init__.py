"""The torch-free contract between the router and the workers: messages and their fields, KV cache
events, block hashing, sampling parameters, logprobs, structured-output specs, generation defaults,
incremental detokenization, the request log and worker roles.

Invariant: nothing here imports torch or transformers (tests/unit/test_import_contracts.py), so the
router can load any of it.
"""
