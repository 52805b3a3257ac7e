#!/usr/bin/env bash
# The engine-speed issue's figures in one device call, as ratios from one run: the new kernels against
# the previous path (PDSERVE_DISABLE_SKINNY=1: decode-sized projections on cuBLAS with separate norm and
# SiLU*mul kernels), alternated twice; then the kernels of a batch-1 step and the prefill kernels.
#   bash benchmarks/engine/gpu_engine_ab.sh TOKENIZER_DIR     (logs go to ${OUT:-/tmp/pdserve-gpu})
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
LOG="${OUT:-/tmp/pdserve-gpu}"
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
M=/tmp/qwen3-0.6b
python3 -m common.tools.random_model --preset qwen3-0.6b --out $M --tokenizer-from "${1:?tokenizer dir}" >/dev/null
for cfg in base new base new; do
  if [ $cfg = base ]; then E="PDSERVE_DISABLE_SKINNY=1"; else E=""; fi
  echo "== $cfg"
  env $E python3 benchmarks/engine/latency.py --model $M 2>&1 | grep "batch-1\|prefill"
  env $E python3 benchmarks/engine/offline.py --model $M --quiet --engine-kwargs '{"max_num_seqs": 256}' \
      --json-out "$LOG/off_$cfg.json" 2>&1 | tail -1
done 2>&1 | tee "$LOG/ab.txt"
python3 benchmarks/engine/kernel_profile.py --model $M --rows 1 2 4 8 16 --top 10 2>&1 | grep -v Loading | tee "$LOG/prof.txt"
python3 benchmarks/engine/skinny_gemm.py --models qwen3-0.6b --sweep --rows 1 4 16 2>&1 | tee "$LOG/skinny.txt"
python3 benchmarks/engine/attention_kernels.py --skip-decode 2>&1 | tail -40 | tee "$LOG/attention.txt"
