#!/usr/bin/env bash
# Make, on this machine, what a lent GPU machine needs carried (it reaches no package index), in folders
# .git/info/exclude ignores, each under one call's 64 MiB with the working tree:
#   .whl      the project's packages the device image lacks, as cp312 manylinux wheels (the versions
#             this checkout's .venv has, so both sides run the same code; ~11 MB)
#   .dev/m1   the default model's GGUF, first part (49 MB)    -> call 1: cp .dev/m1/* /tmp/gg/
#   .dev/m2   the rest, with its sha256 (49 MB)               -> the call that sources device_prep.sh
#   .ray/p1   with RAY=1: Ray's wheel, first part (40 MB)     -> a call: cp .ray/p1/* /tmp/raywhl/
#   .ray/p2   the rest, its sha256 and the four wheels Ray needs that the image lacks
#             -> a call: bash benchmarks/device_ray.sh (joins, checks, installs with .whl)
# Each call after the first must start within ~30 s of the last one's end, while the machine is warm
# (its /tmp survives only that long). Needs `bash scripts/setup.sh` first.
#   bash benchmarks/device_carry.sh          RAY=1 bash benchmarks/device_carry.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=.venv/bin/python
for d in /.whl/ /.dev/ /.ray/; do grep -qxF "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude; done

version() { "$PY" -m pip show "$1" 2>/dev/null | awk '/^Version:/{print $2}'; }
download() {  # $1 folder, then NAME==VERSION ...: cp312 wheels for the device's x86-64 Linux
  local dir=$1 plat=()
  shift
  for n in 1 5 17 24 26 27 28 31 34 35; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 "${plat[@]}" --platform any -d "$dir" "$@"
}
pinned() { for p in "$@"; do echo "$p==$(version "$p")"; done; }

# The packages the device image lacks (docs: the device tool's KINDS.md lists what it has).
rm -rf .whl && mkdir -p .whl
download .whl $(pinned pyzmq fastapi starlette pydantic pydantic_core annotated-types typing-inspection \
  opentelemetry-api annotated-doc uvicorn httptools llguidance gguf py-spy)

# The default model's GGUF in exactly two parts.
gguf=$("$PY" -c "from common.tools.default_model import gguf_path; print(gguf_path())")
rm -rf .dev/m1 .dev/m2 && mkdir -p .dev/m1 .dev/m2
half=$(( ($(stat -c %s "$gguf") + 1) / 2 ))
head -c "$half" "$gguf" > .dev/m1/gguf.part.00
tail -c +"$((half + 1))" "$gguf" > .dev/m2/gguf.part.01
(cd "$(dirname "$gguf")" && sha256sum "$(basename "$gguf")") > .dev/m2/SHA256

if [ -n "${RAY:-}" ]; then
  rm -rf .ray && mkdir -p .ray/p1 .ray/p2
  download .ray/p2 "ray==$(version ray)" jsonschema jsonschema-specifications referencing rpds-py
  wheel=$(ls .ray/p2/ray-*.whl)
  (cd .ray/p2 && sha256sum "$(basename "$wheel")") > .ray/p2/SHA256
  head -c 40000000 "$wheel" > .ray/p1/ray.part.00
  tail -c +40000001 "$wheel" > .ray/p2/ray.part.01
  basename "$wheel" > .ray/p2/WHEEL
  rm "$wheel"
fi
du -sh .whl .dev/m1 .dev/m2 ${RAY:+.ray/p1 .ray/p2}
