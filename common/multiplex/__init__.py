"""Multiplexed mode: prefill and decode side by side on SM shares of one GPU, in one engine.

`partitions.py` is the backend interface (green contexts on CUDA, inline on the CPU), `controller.py`
picks each prefill chunk's share from the decode gaps, `stepper.py` is the engine loop that keeps a
chunk in flight beside the decode steps. `docs/architecture.md` tells the whole story."""
