#!/usr/bin/env bash
# Top-k among each row's best tokens (`PDSERVE_TOPK_CANDIDATES`, runner/sampling_filters.py; drawn by the
# candidate kernel, runner/candidate_kernel.py, unless PDSERVE_FUSED_SAMPLING=0) against sorted rows, on
# what a default is chosen on; docs/benchmarks.md "Top-k among each row's best tokens".
#   bash benchmarks/engine/top_k_ab.sh [REAL_MODEL_DIR]     # ~5 min on an H100, one device call
# The sampler's tests on the GPU, the per-call table at the default model's vocabulary and Qwen3's
# (T=0.6, top_p 0.95, top_k 20: Qwen3's generation config), then the real default model's mixed
# workload (2,048 prompts of 128-512 in / out) and the Qwen3-0.6B shape's standard workload, both at
# top_k 20 / top_p 0.95, arms sorted (c0), best drawn by torch (ctorch: PDSERVE_FUSED_SAMPLING=0) and
# best drawn by the kernel (c1024), in the order of ARMS_ORDER, each a fresh process.
# ARMS_ORDER and STOP_S (no new run after that many seconds; 520) may be set to fit a shorter call.
# REAL_MODEL_DIR defaults to `python3 -m common.tools.default_model` (after `source
# benchmarks/device_prep.sh`). Logs and JSON go to ${OUT:-/tmp/pdserve-gpu}/top_k.
source "$(dirname "${BASH_SOURCE[0]}")/env_ab.sh" top_k
REAL="${1:-$(python3 -m common.tools.default_model)}"
Q=/tmp/qwen3-0.6b
python3 -m pytest -q -p no:cacheprovider tests/unit/common/runner/test_top_k_candidates.py \
  tests/unit/common/runner/test_candidate_kernel.py tests/unit/common/runner/test_sampling_kernel.py \
  tests/unit/common/test_sampling.py 2>&1 | tail -3 | tee "$LOG/tests.txt"
python3 benchmarks/engine/sampling.py --vocab 49152 151936 --batches 1 8 64 256 --top-k 20 --top-k-only \
  > "$LOG/sampling.txt" 2>&1
tail -9 "$LOG/sampling.txt"
ARMS_ORDER="${ARMS_ORDER:-0 torch 1024 1024 torch 0 0 1024 torch}"
[ -d $Q ] || python3 -m common.tools.random_model --preset qwen3-0.6b --out $Q --tokenizer-from "$REAL" \
  --device cuda >/dev/null
n=0
for arm in $ARMS_ORDER; do
  [ "$(elapsed)" -gt "${STOP_S:-520}" ] && echo "stopped after $n runs (time)" && break
  n=$((n + 1))
  c=$arm fused=auto
  [ "$arm" = torch ] && c=1024 fused=0
  run() { PDSERVE_TOPK_CANDIDATES=$c PDSERVE_FUSED_SAMPLING=$fused python3 benchmarks/engine/offline.py --quiet \
    --top-k 20 --top-p 0.95 "$@" 2>&1 | quiet; }
  run --model "$REAL" --input-len 128 512 --output-len 128 512 --num-seqs 2048 --json-out "$LOG/mixed_c${arm}_$n.json"
  run --model $Q --engine-kwargs '{"max_num_seqs": 256}' --json-out "$LOG/std_c${arm}_$n.json"
done
medians c 0
