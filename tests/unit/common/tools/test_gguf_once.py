"""`read_once`: while a conversion runs, one GGUF reader per file and one tensor-name table per shape,
which read what fresh ones read; the `gguf` package's own functions come back afterwards."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from common.tools.gguf_once import read_once

Q_PROJ = "model.layers.1.self_attn.q_proj"


@pytest.fixture
def small_gguf(tmp_path: Path) -> Path:
    """A real GGUF file: a llama architecture header, a token list and two float32 tensors."""
    path = tmp_path / "small.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_token_list([f"tok{i}" for i in range(300)])
    writer.add_tensor("token_embd.weight", np.arange(24, dtype=np.float32).reshape(4, 6))
    writer.add_tensor("output_norm.weight", np.ones(6, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _contents(reader) -> tuple[dict, dict]:
    fields = {name: [bytes(p) for p in field.parts] for name, field in reader.fields.items()}
    tensors = {t.name: np.array(t.data).tolist() for t in reader.tensors}
    return fields, tensors


def test_one_reader_per_file_reads_what_a_fresh_one_reads(small_gguf: Path) -> None:
    fresh = _contents(gguf.GGUFReader(small_gguf))
    with read_once():
        first = gguf.GGUFReader(str(small_gguf))
        again = gguf.GGUFReader(small_gguf)  # a Path for the same file: the same reader
        assert again is first
        assert _contents(first) == fresh
        assert _contents(again) == fresh  # a second use reads the same (nothing in a reader is consumed)
        assert gguf.GGUFReader(small_gguf, "c") is not first  # a copy-on-write map is never shared
    assert gguf.GGUFReader(small_gguf) is not first  # outside: a fresh reader per call again


def test_one_name_table_per_architecture_and_block_count() -> None:
    with read_once():
        table = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is table
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 3) is not table
        assert table.get_name(Q_PROJ) == "blk.1.attn_q"
    fresh = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
    assert fresh is not table and fresh.get_name(Q_PROJ) == "blk.1.attn_q"


def test_the_originals_come_back_after_an_error() -> None:
    reader, names = gguf.GGUFReader, gguf.get_tensor_name_map
    with pytest.raises(RuntimeError, match="conversion failed"), read_once():
        assert gguf.GGUFReader is not reader
        raise RuntimeError("conversion failed")
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader, names)
