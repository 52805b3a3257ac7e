#!/usr/bin/env bash
# Everything the GPU issue measures, in one device call: GPU tests, then the benchmarks, then a table.
#   bash benchmarks/engine/gpu_suite.sh [quick|full]     (logs and JSON go to ${OUT:-/tmp/pdserve-gpu})
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
MODE="${1:-full}"
LOG="${OUT:-/tmp/pdserve-gpu}"
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=python3
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$LOG/gpu.txt"
git rev-parse --short HEAD 2>/dev/null | tee "$LOG/commit.txt"

$PY -m pytest -q -p no:cacheprovider -n 4 --dist loadfile -m gpu ${GPU_TESTS:-tests/unit/common} 2>&1 | tail -25 | tee "$LOG/tests.txt"

MODEL=/tmp/qwen3-0.6b
$PY -m common.tools.random_model --preset qwen3-0.6b --out "$MODEL" >/dev/null
$PY benchmarks/engine/latency.py --model "$MODEL" --json-out "$LOG/latency.json" 2>&1 | grep -v Loading | tail -3
if [ "$MODE" = full ]; then
  $PY benchmarks/engine/offline.py --model "$MODEL" --quiet --engine-kwargs '{"max_num_seqs": 256}' \
      --json-out "$LOG/offline.json" 2>&1 | tail -4
  $PY benchmarks/engine/offline.py --model "$MODEL" --quiet --num-seqs 64 --input-len 512 512 \
      --output-len 128 128 --compare-hf --json-out "$LOG/offline_vs_hf.json" 2>&1 | tail -5
  $PY benchmarks/engine/attention_kernels.py 2>&1 | tail -40 | tee "$LOG/attention.txt"
else
  $PY benchmarks/engine/offline.py --model "$MODEL" --quiet --num-seqs 64 --input-len 100 512 --output-len 100 256 \
      --json-out "$LOG/offline.json" 2>&1 | tail -4
fi
echo "== summary ($MODE) =="
$PY - "$LOG" <<'PY'
import json, sys, pathlib
log = pathlib.Path(sys.argv[1])
def load(name):
    p = log / name
    return json.loads(p.read_text()) if p.exists() else None
lat, off, hf = load("latency.json"), load("offline.json"), load("offline_vs_hf.json")
if lat: print(f"decode batch1 @{lat['context']} ctx: {lat['tpot_ms']:.3f} ms/tok | prefill {lat['prefill_tok_per_s']:,.0f} tok/s")
if off: print(f"offline throughput: {off[0]['tok_per_s']:,.0f} out tok/s ({off[0]['output_tokens']} tok, {off[0]['seconds']:.2f}s)")
if hf: print(f"vs transformers (64x512/128): ours {hf[0]['tok_per_s']:,.0f}, hf {hf[1]['tok_per_s']:,.0f}, ratio {hf[0]['tok_per_s']/hf[1]['tok_per_s']:.1f}x")
PY
