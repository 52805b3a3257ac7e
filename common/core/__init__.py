"""The engine's bookkeeping, independent of the device: sequences, the block manager, the scheduler,
the admission policy (request_queue.py), run-ahead decoding and the stop rules."""
