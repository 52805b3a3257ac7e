#!/usr/bin/env bash
# Goodput past capacity (issue 26 item 4): does a cluster keep completing requests at its peak rate when
# twice as many arrive, shedding the excess with 429 instead of collapsing?
#   bash benchmarks/serving/overload.sh [MODEL_DIR]            (default: the default model)
# One cluster (LAUNCH, default `--backend local --prefill 0 --decode 0 --mixed 1`), with
# `--max-running-requests` BOUND (default 32). Peak: a closed loop of BOUND clients (requests of IN_LEN
# random tokens in / OUT_LEN out, greedy) for about DURATION s; its completed requests per second are
# the capacity P. Then open-loop Poisson arrivals at MULT x P (default 2) for DURATION s. Runs
# alternate (peak, overload) REPEAT times (default 3); the table gives each run's completed/s and the
# median ratio. Goodput here = completed requests per second (the issue's definition); 429s count as
# not completed. Every run draws its own prompts (its own --seed): a repeated prompt would be served
# from the prefix cache and inflate the next run's rate. Logs go to ${OUT:-/tmp/pdserve-overload}.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source benchmarks/launch_ready.sh
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
LOG="${OUT:-/tmp/pdserve-overload}"
mkdir -p "$LOG"
MODEL="${1:-$(python3 -m common.tools.default_model)}"
BOUND="${BOUND:-32}" DURATION="${DURATION:-30}" MULT="${MULT:-2}" IN_LEN="${IN_LEN:-64}" OUT_LEN="${OUT_LEN:-16}"
BENCH=(python3 benchmarks/serving/serving.py --client-procs "${CLIENT_PROCS:-1}" --input-len "$IN_LEN"
  --output-len "$OUT_LEN" --temperature 0)
# shellcheck disable=SC2086
python3 -m deploy.launch --model "$MODEL" --port 0 ${LAUNCH:---backend local --prefill 0 --decode 0 --mixed 1} --max-running-requests "$BOUND" \
  --log-dir "$LOG/logs" > "$LOG/launch.txt" 2>&1 &
LAUNCHER=$!
trap 'kill -TERM $LAUNCHER 2>/dev/null; wait $LAUNCHER' EXIT
wait_ready "$LOG/launch.txt" $LAUNCHER 300
URL=$(grep -o "http://[^ ]*/v1" "$LOG/launch.txt" | head -1)
[ -n "$URL" ] || { echo "the cluster did not start"; tail -5 "$LOG/launch.txt"; exit 1; }
"${BENCH[@]}" --base-url "$URL" --num-prompts 16 > /dev/null 2>&1  # warm-up

rate_of() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['summary']['request_throughput_per_s'])" "$1"; }
for r in $(seq 1 "${REPEAT:-3}"); do
  # Closed loop: enough requests to keep BOUND busy for DURATION s at the last measured rate.
  n=$(python3 -c "print(max(int(${PEAK:-8} * $DURATION), 4 * $BOUND))")
  "${BENCH[@]}" --base-url "$URL" --num-prompts "$n" --max-concurrency "$BOUND" --seed "$r" --json-out "$LOG/peak.r$r.json" \
    > "$LOG/peak.r$r.txt" 2>&1
  PEAK=$(rate_of "$LOG/peak.r$r.json")
  rate=$(python3 -c "print($MULT * $PEAK)")
  n=$(python3 -c "print(int($MULT * $PEAK * $DURATION))")
  "${BENCH[@]}" --base-url "$URL" --num-prompts "$n" --request-rate "$rate" --seed "$((100 + r))" --json-out "$LOG/over.r$r.json" \
    > "$LOG/over.r$r.txt" 2>&1
  echo "run $r: peak $PEAK req/s; at $rate req/s offered: $(rate_of "$LOG/over.r$r.json") req/s completed"
done
python3 benchmarks/serving/overload_table.py "$LOG" | tee "$LOG/table.md"
