"""The device side of the engine: input preparation, the model runner and the sampler."""
