"""Tools built on the engine: the `pdserve chat` command, the default model's preparation and
random-weight models of real shapes for benchmarks."""
