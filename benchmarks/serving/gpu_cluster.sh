#!/usr/bin/env bash
# Disaggregated against aggregated serving on two GPUs of one host (nvidia-h200-x2), in one device call:
#   bash benchmarks/serving/gpu_cluster.sh [MODEL_DIR]      (default: the default model; see device_prep.sh)
# Setups (SETUPS, default "offline mixed nccl ipc auto"):
#   offline  the offline engine on one GPU, random workload only (the reference figure): exactly the
#            served requests (offline.py --served-set: same prompts, max_tokens, greedy, ignore_eos)
#   mixed    aggregated: colocated workers (MIXED_N, default 2: one per GPU) behind the router
#   nccl/ipc 1 prefill (GPU 0) + 1 decode (GPU 1), KV over that transport, every request disaggregated
#   auto     1 prefill + 1 decode, the router decides per request (--disagg auto); AUTO_SHAPE overrides
#            the worker counts (e.g. "--prefill 1 --decode 3")
#   1p3d     1 prefill + 3 decode, 2p2d: 2 prefill + 2 decode, KV over KV (default auto), every request
#            disaggregated (four GPUs: see benchmarks/serving/gpu_four.sh)
# BACKEND=ray places the workers through Ray's GPU resources (default local processes).
# Workloads (WORKLOADS, default "random interference multiturn"), see benchmarks/serving/serving.py (interference:
# LONG_RATE long prompts per second, default 1, or interference@R for R per second; GOODPUT adds SLO flags
# such as "--goodput-ttft-ms 1000 --goodput-itl-ms 50"), each sized to
# run >= 30 s on one H200 (RANDOM_PROMPTS, default 12288 requests of 512 in / 128 out, also the offline
# reference's count; INTERF_S, default 30; MT_CONVERSATIONS, default 768): runs of 2-4 s differed by up to
# 1.8x. REPEAT=N (default 3) runs each N times on the same cluster; the table gives median and min-max.
# PROFILE=1 samples every cluster process with py-spy for PROFILE_S seconds (default 4) of each run,
# starting PROFILE_DELAY_S (default 0) into it: the clients take seconds to start sending, so a window
# at 0 can see idle workers (call C, 2026-12-03). Logs and JSON go to ${OUT:-/tmp/pdserve-cluster}/$TAG;
# the table comes last.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source benchmarks/launch_ready.sh
TAG="${TAG:-real}"
LOG="${OUT:-/tmp/pdserve-cluster}/$TAG"
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
MODEL="${1:-$(python3 -c 'from common.tools.default_model import resolve_model; print(resolve_model(None))')}"
# A tokenizer that lacks ids of the model's vocabulary (a random-weight shape given another model's
# tokenizer) streams no text for them, and the client's TTFT and inter-token gaps then measure that:
# say so before any figure is taken (common/tools/random_model.py's cover_vocabulary fixes it).
python3 - "$MODEL" <<'PY'
import sys
from common.tools.random_model import uncovered_ids
if lacking := uncovered_ids(sys.argv[1]):
    print(f"WARNING: the tokenizer lacks {lacking:,} of the model's ids: TTFT and ITL void when they are"
          " sampled (python -m common.tools.random_model --tokenizer-from covers them)")
PY
SETUPS="${SETUPS:-offline mixed nccl ipc auto}"
WORKLOADS="${WORKLOADS:-random interference multiturn}"
RANDOM_PROMPTS="${RANDOM_PROMPTS:-12288}"
BENCH="${BENCH:-python3 benchmarks/serving/serving.py --client-procs ${CLIENT_PROCS:-4}}"
# The device machine's copy of .git may lag the working tree: the caller passes PDSERVE_COMMIT.
echo "${PDSERVE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}" > "$LOG/commit.txt"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$LOG/gpu.txt"

setup_flags() {
  case $1 in
    mixed) echo "--prefill 0 --decode 0 --mixed ${MIXED_N:-2} --disagg never" ;;
    nccl) echo "--prefill 1 --decode 1 --kv-transport nccl --disagg always" ;;
    ipc) echo "--prefill 1 --decode 1 --kv-transport ipc --disagg always" ;;
    auto) echo "${AUTO_SHAPE:---prefill 1 --decode 1} --kv-transport auto --disagg auto" ;;
    1p3d) echo "--prefill 1 --decode 3 --kv-transport ${KV:-auto} --disagg always" ;;
    2p2d) echo "--prefill 2 --decode 2 --kv-transport ${KV:-auto} --disagg always" ;;
  esac
}

workload() {  # $1 workload, $2 json path
  case $1 in
    random) $BENCH --base-url "$URL" --num-prompts "$RANDOM_PROMPTS" --input-len 512 --output-len 128 \
        --max-concurrency 256 --json-out "$2" ;;
    interference|interference@*) local rate=${LONG_RATE:-1}; [ "$1" != "${1#*@}" ] && rate=${1#*@}
      $BENCH --base-url "$URL" --workload interference --duration ${INTERF_S:-30} --chat-concurrency 64 \
        --input-len 256 --output-len 256 --long-len 6000 --long-rate "$rate" ${GOODPUT:-} --json-out "$2" ;;
    multiturn) $BENCH --base-url "$URL" --workload multi-turn --num-conversations ${MT_CONVERSATIONS:-768} --turns 4 \
        --input-len 512 --output-len 128 --max-concurrency 64 --json-out "$2" ;;
  esac
}

cpu_times() {  # CPU seconds so far of each cluster and client process (which one saturates a core)
  ps -eo pid,times,args | grep -E -- "-m (router|prefill_worker|decode_worker|deploy)|serving.py|multiprocessing.spawn" | grep -v grep
}

PROFILERS=()
profile() {  # sample every process of the cluster for a few seconds (py-spy, collapsed stacks)
  PROFILERS=()
  for m in router prefill_worker decode_worker; do
    for pid in $(pgrep -f -- "-m $m( |$)"); do
      (sleep "${PROFILE_DELAY_S:-0}" && py-spy record --nonblocking -r 100 -d "${PROFILE_S:-4}" --format raw \
          -o "$1.$m.$pid.txt" --pid "$pid" >/dev/null 2>&1) &
      PROFILERS+=($!)
    done
  done
  sleep 0.5
}
wait_profiles() { for p in "${PROFILERS[@]}"; do wait "$p"; done; PROFILERS=(); }

run_setup() {
  local setup=$1 dir="$LOG/$1"
  mkdir -p "$dir"
  # shellcheck disable=SC2046
  python3 -m deploy.launch --model "$MODEL" --backend "${BACKEND:-local}" --port 0 --max-num-seqs 256 \
      --max-model-len 8192 $(setup_flags "$setup" | sed "${NO_DISAGG:+s/--disagg [a-z]*//}") ${LAUNCH_EXTRA:-} --log-dir "$dir/logs" \
      > "$dir/launch.txt" 2>&1 &
  local launch=$!
  wait_ready "$dir/launch.txt" $launch 180
  URL=$(grep -o "http://[^ ]*/v1" "$dir/launch.txt" | head -1)
  if [ -z "$URL" ]; then echo "$setup: cluster did not start"; tail -5 "$dir/launch.txt"; kill $launch; return; fi
  $BENCH --base-url "$URL" --num-prompts 32 --input-len 512 --output-len 16 >/dev/null 2>&1  # warm-up
  for w in $WORKLOADS; do
    for r in $(seq 1 "${REPEAT:-3}"); do  # REPEAT > 1: runs named WORKLOAD.r2, .r3, ... in the table
      local name="$w"
      [ "$r" -gt 1 ] && name="$w.r$r"
      curl -s "${URL%/v1}/metrics" > "$dir/$name.metrics.before"
      cpu_times > "$dir/$name.cpu.before"
      [ -n "${PROFILE:-}" ] && profile "$dir/$name"
      workload "$w" "$dir/$name.json" > "$dir/$name.txt" 2>&1
      wait_profiles
      curl -s "${URL%/v1}/metrics" > "$dir/$name.metrics.after"
      cpu_times > "$dir/$name.cpu.after"
    done
  done
  kill -TERM $launch; wait $launch
}

for setup in $SETUPS; do
  if [ "$setup" = offline ]; then
    python3 benchmarks/engine/offline.py --model "$MODEL" --quiet --num-seqs "$RANDOM_PROMPTS" --input-len 512 512 \
        --output-len 128 128 --served-set --temperature 0 --engine-kwargs '{"max_num_seqs": 256}' \
        --json-out "$LOG/offline.json" > "$LOG/offline.txt" 2>&1
    tail -2 "$LOG/offline.txt"
  else
    run_setup "$setup"
  fi
done
python3 benchmarks/serving/cluster_table.py "$LOG" | tee "$LOG/table.md"
tar czf "$LOG.tgz" -C "$(dirname "$LOG")" "$(basename "$LOG")" 2>/dev/null
