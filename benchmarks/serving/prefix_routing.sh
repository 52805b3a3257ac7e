#!/usr/bin/env bash
# Prefix-aware routing vs round-robin with 2 prefill workers on a shared-prefix workload (CPU is fine).
#   bash benchmarks/serving/prefix_routing.sh        (JSON results under ${OUT:-/tmp/pdserve-routing})
#   API_SERVERS=2 ROUTINGS=prefix bash benchmarks/serving/prefix_routing.sh   (two router fronts; prefix only)
# 16 prefixes used 3 times each; each prefill worker's KV cache (170 blocks) holds about 9 of them: prefix-aware
# routing splits the prefixes between the workers so each keeps its half; round-robin makes both
# workers see all of them, so their caches duplicate and evict each other's prefixes.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source benchmarks/launch_ready.sh
LOG="${OUT:-/tmp/pdserve-routing}"
mkdir -p "$LOG"
PY=${PY:-.venv/bin/python}
for ROUTING in ${ROUTINGS:-prefix round_robin}; do
  $PY -m deploy.launch --backend local --prefill 2 --decode 1 --kv-transport tcp --routing "$ROUTING" \
      --api-servers "${API_SERVERS:-1}" \
      --port 0 --num-kvcache-blocks 170 --max-model-len 2048 > "$LOG/launch_$ROUTING.txt" 2>&1 &
  LAUNCH=$!
  wait_ready "$LOG/launch_$ROUTING.txt" $LAUNCH 180
  URL=$(grep -o "http://[^ ]*/v1" "$LOG/launch_$ROUTING.txt" | head -1)
  echo "== $ROUTING ($URL)"
  $PY benchmarks/serving/serving.py --base-url "$URL" --workload shared-prefix --num-prefixes 16 --prefix-len 256 \
      --suffix-len 32 --output-len 4 --num-prompts "${NUM_PROMPTS:-48}" --max-concurrency "${CONCURRENCY:-2}" --request-rate inf --seed 3 \
      --json-out "$LOG/$ROUTING.json" 2>&1 | grep -E "ttft_ms mean|ttft_ms p50|cached|output_tokens_per_s|duration"
  kill -TERM $LAUNCH; wait $LAUNCH
done
[ -f "$LOG/round_robin.json" ] || exit 0  # prefix routing alone: its figures are printed above
$PY - "$LOG" <<'PY'
import json, sys, pathlib
log = pathlib.Path(sys.argv[1])
def load(name):
    d = json.loads((log / f"{name}.json").read_text())
    return d.get("summary", d)
p, r = load("prefix"), load("round_robin")
def get(d, *keys):
    for k in keys:
        if k in d: return d[k]
    raise KeyError(keys)
ttft = lambda d: get(d, "ttft_ms_mean", "mean_ttft_ms") if not isinstance(d.get("ttft_ms"), dict) else d["ttft_ms"]["mean"]
cached = lambda d: get(d, "total_cached_tokens")
print(f"mean TTFT: prefix {ttft(p):.0f} ms, round-robin {ttft(r):.0f} ms -> {ttft(r) / ttft(p):.1f}x lower")
print(f"cached prompt tokens: prefix {cached(p)}, round-robin {cached(r)} -> {cached(p) / max(cached(r), 1):.1f}x more")
PY
