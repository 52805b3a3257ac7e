"""The engine's bookkeeping, independent of the device: sequences, the block manager, the scheduler,
run-ahead decoding and the stop rules."""
