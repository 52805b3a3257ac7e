#!/usr/bin/env bash
# The decode help for skewed batches (decode_plan.SkewHelp, `PDSERVE_DECODE_SKEW_HELP`), off against on,
# on the workloads a default is chosen on; docs/benchmarks.md "The decode help as the default".
#   bash benchmarks/engine/skew_help_ab.sh small [REAL_MODEL_DIR]   # ~8 min: GPU tests, kernel, 0.6B + real
#   bash benchmarks/engine/skew_help_ab.sh 8b [TOKENIZER_DIR]       # ~6 min: 8B shape, engine level
# `small`: the GPU tests of the decode kernel, `decode_skew.py` on a skewed batch and on the standard
# workload's lengths, then the offline standard workload (Qwen3-0.6B shape) and the real default
# model's mixed workload (2,048 prompts: ~11 s a run on an H100) with the help 0, 1, 1, 0, 0, 1, each
# a fresh process; REAL_MODEL_DIR defaults to `python3 -m common.tools.default_model` (after
# `source benchmarks/device_prep.sh`). `8b`: the Qwen3-8B shape's floors, then `pd_multiplex.py`
# (aggregated chunk 512, the fixed 64-SM share, the same with `:after`) with the help 0, 1, 1, 0.
# Each part fits one device call (600 s); logs and JSON go to ${OUT:-/tmp/pdserve-gpu}/skew_help.
source "$(dirname "${BASH_SOURCE[0]}")/env_ab.sh" skew_help

small() {
  local real="${1:-$(python3 -m common.tools.default_model)}" q=/tmp/qwen3-0.6b n=0
  python3 -m pytest -q -p no:cacheprovider -m gpu tests/unit/common/attention \
    tests/unit/benchmarks/engine/test_decode_skew.py 2>&1 | tail -30 > "$LOG/gpu_tests.txt"
  tail -1 "$LOG/gpu_tests.txt"
  python3 benchmarks/engine/decode_skew.py --batches 64,256 --long-rows 0,1,4 | tee "$LOG/decode_skew.txt"
  python3 benchmarks/engine/decode_skew.py --batches 64,256 --short 100 --short-max 2048 --long-rows 0 \
    | tee "$LOG/decode_skew_std.txt"
  [ -d $q ] || python3 -m common.tools.random_model --preset qwen3-0.6b --out $q --tokenizer-from "$real" \
    --device cuda >/dev/null
  for help in 0 1 1 0 0 1; do
    [ "$(elapsed)" -gt 520 ] && echo "stopped after $n pairs (time)" && break
    n=$((n + 1))
    PDSERVE_DECODE_SKEW_HELP=$help python3 benchmarks/engine/offline.py --model $q --quiet \
      --engine-kwargs '{"max_num_seqs": 256}' --json-out "$LOG/std_help${help}_$n.json" 2>&1 | quiet
    PDSERVE_DECODE_SKEW_HELP=$help python3 benchmarks/engine/offline.py --model "$real" --quiet \
      --input-len 128 512 --output-len 128 512 --num-seqs 2048 --json-out "$LOG/mixed_help${help}_$n.json" 2>&1 | quiet
  done
  medians help 0
}

eight_b() {
  local q8=/tmp/q8 n=0
  [ -d $q8 ] || python3 -m common.tools.random_model --preset qwen3-8b --out $q8 --device cuda \
    ${1:+--tokenizer-from "$1"} >/dev/null
  python3 benchmarks/engine/floors.py --model $q8 --json-out "$LOG/floors8b.json" 2>&1 | tail -4 | tee "$LOG/floors8b.txt"
  for help in 0 1 1 0; do
    [ "$(elapsed)" -gt 440 ] && echo "stopped after $n runs (time)" && break
    n=$((n + 1))
    PDSERVE_DECODE_SKEW_HELP=$help python3 benchmarks/engine/pd_multiplex.py --model $q8 --streams 64 \
      --rounds 1 --chunks 512 --mux-chunk 8192 --long-count 6 --long-interval-s 0.5 --slo-itl-ms 50 \
      --step-classes --mux-arms "30:sms64,30:sms64:after" > "$LOG/8b_help${help}_$n.txt" 2>&1
    echo "== help $help"
    grep -A3 "^arm " "$LOG/8b_help${help}_$n.txt" | tail -3
  done
}

case "${1:-}" in
  small) small "${2:-}" ;;
  8b) eight_b "${2:-}" ;;
  *) echo "usage: skew_help_ab.sh small|8b [MODEL_OR_TOKENIZER_DIR]" && exit 2 ;;
esac
