"""Tools built on the engine: the `pdserve chat` command, the default model's preparation,
random-weight models of real shapes for benchmarks, and tiny random checkpoints (with a transformers
greedy reference) that the tests and the CPU benchmarks share."""
