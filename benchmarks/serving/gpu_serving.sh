#!/usr/bin/env bash
# Disaggregated serving on one GPU: 1 prefill + 1 decode worker over CUDA IPC, vs the offline engine.
#   bash benchmarks/serving/gpu_serving.sh TOKENIZER_DIR      (logs and JSON under ${OUT:-/tmp/pdserve-serving})
# Uses SmolLM2-135M-architecture random weights with the default model's tokenizer (no hub needed).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source benchmarks/launch_ready.sh
TOK="${1:?tokenizer dir}"
LOG="${OUT:-/tmp/pdserve-serving}"
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
MODEL=/tmp/smollm2-random
python3 -m common.tools.random_model --preset smollm2-135m --out "$MODEL" --tokenizer-from "$TOK" >/dev/null
N=${NUM_PROMPTS:-512}; IN=${INPUT_LEN:-512}; OUTLEN=${OUTPUT_LEN:-128}
python3 -m deploy.launch --model "$MODEL" --backend local --prefill 1 --decode 1 --kv-transport "${KV_TRANSPORT:-ipc}" \
    --port 0 --max-model-len 4096 --max-num-seqs 256 --log-dir "$LOG/cluster" > "$LOG/launch.txt" 2>&1 &
LAUNCH=$!
wait_ready "$LOG/launch.txt" $LAUNCH 120
URL=$(grep -o "http://[^ ]*/v1" "$LOG/launch.txt" | head -1)
echo "cluster at $URL"
python3 benchmarks/serving/serving.py --base-url "$URL" --num-prompts 32 --input-len "$IN" --output-len 16 --seed 1 \
    --request-rate inf >/dev/null 2>&1  # warm-up
python3 benchmarks/serving/serving.py --base-url "$URL" --num-prompts "$N" --input-len "$IN" --output-len "$OUTLEN" \
    --request-rate inf --max-concurrency 256 --json-out "$LOG/serving.json" 2>&1 | tail -16
curl -s "${URL%/v1}/metrics" | grep -E "^pdserve_kv_transfer_(bytes_total|seconds_(sum|count))" | tee "$LOG/kv.txt"
kill -TERM $LAUNCH; wait $LAUNCH
python3 benchmarks/engine/offline.py --model "$MODEL" --quiet --num-seqs "$N" --input-len "$IN" "$IN" \
    --output-len "$OUTLEN" "$OUTLEN" --temperature 1.0 --json-out "$LOG/offline.json" 2>&1 | tail -3
python3 benchmarks/engine/latency.py --model "$MODEL" --context "$IN" --json-out "$LOG/latency.json" 2>&1 | tail -2
