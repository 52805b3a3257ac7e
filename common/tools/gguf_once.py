"""Read a GGUF file once while transformers converts it (common/tools/default_model.py).

transformers reads the file three times, for the config, the tokenizer and the weights, and each read
parses every metadata field again, the ~49k-entry vocabulary included. For each of the model's ~400
modules it also builds gguf's tensor-name table again. On the 2-core CPU box that was about 18 s of
the default model's 25-s preparation. Both come from the `gguf` package: transformers imports
`GGUFReader` and `get_tensor_name_map` from it when it calls them. So `read_once()` swaps in memoized
versions for the length of a conversion.

Both are safe to share. A reader is built in its constructor (fields and tensors as views of a
read-only memmap) and only read after that, and a name table is only looked up. The default model
converted with and without them gave the same bytes in every file (sha256, 2026-12-07; 27.0 s
against 12.4 s on the CPU box). `tests/unit/common/tools/test_gguf_once.py` checks that a shared reader
reads what a fresh one reads, on a real GGUF file.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator


@contextlib.contextmanager
def read_once() -> Iterator[None]:
    """While inside: one `gguf.GGUFReader` per path (read-only mode) and one tensor-name table per
    (architecture, block count). The originals come back on exit, even after an error."""
    import gguf

    original_reader, original_names = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[str, object] = {}

    def reader(path, mode="r"):
        if mode != "r":  # a writable map is not ours to share
            return original_reader(path, mode)
        key = os.path.realpath(os.fspath(path))
        if key not in readers:
            readers[key] = original_reader(path, mode)
        return readers[key]

    gguf.GGUFReader = reader
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(original_names)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = original_reader, original_names
