#!/usr/bin/env bash
# Four GPUs (nvidia-h200-x4), one device call: 1 prefill + 3 decode (the mission's own example), 2 + 2,
# 4 colocated workers and `--disagg auto` over 1 + 3, all under Ray, on the three workloads of
# benchmarks/serving/gpu_cluster.sh, whose setups and table this reuses; the table ends with the line
# `four GPUs H200x4 1P+3D: N tok/s (4 colocated: M tok/s)`.
#   bash benchmarks/serving/gpu_four.sh [MODEL_DIR]
# Ray is not on the device image: carry its wheel (split in two parts over two calls, as the default
# model's GGUF; see benchmarks/device_prep.sh) and install it before. DRY=1 is the scaled-down run of
# the same comparison on two GPUs (nvidia-h200-x2): 1 prefill + 1 decode against 2 colocated workers.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
if [ -n "${DRY:-}" ]; then
  export SETUPS="${SETUPS:-mixed ipc auto}" MIXED_N=2 TAG="${TAG:-four-dry}"
else
  export SETUPS="${SETUPS:-offline 1p3d 2p2d mixed auto}" MIXED_N=4 AUTO_SHAPE="--prefill 1 --decode 3"
  export TAG="${TAG:-four}"
fi
export BACKEND="${BACKEND:-ray}"
exec bash benchmarks/serving/gpu_cluster.sh "$@"
