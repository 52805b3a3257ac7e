#!/usr/bin/env bash
# The standard figures for this tree and a base tree, alternated, in one device call; then a table with
# the ratio per figure. Run it before a GPU-path change lands, and record the table with the change.
#   bash benchmarks/regress.sh BASE [MODEL_DIR]        (logs and JSON go to ${OUT:-/tmp/pdserve-gpu}/regress)
# BASE: a folder holding the base tree (made here: `git archive COMMIT | tar -x -C DIR`, carried with the
# call), a commit (where git and the repository are there), or `-` (only this tree's arms, the first the
# reference). MODEL_DIR: the real default model (default:
# `python3 -m common.tools.default_model`, i.e. after `source benchmarks/device_prep.sh`); its tokenizer
# also serves the random-weight Qwen3-0.6B shape. Both trees run THIS tree's benchmarks/ scripts, so a
# figure measures the engine, not a changed measuring script.
# Figures (each arm a fresh process per figure, arms alternated, ROUNDS rounds):
#   std    offline standard workload, Qwen3-0.6B shape (random bf16 weights): 256 prompts of 100-1024
#          tokens, 100-1024 out, T=0.6, max_num_seqs 256 (benchmarks/engine/offline.py's defaults)
#   mixed  the real default model: 256 prompts of 128-512 random tokens, 128-512 out, T=0.6
#   lat    Qwen3-0.6B shape: decode step at 1,000 context for 1 and 64 rows; prefill 8 x 2,048
#   serve  the real default model behind the router with one mixed worker (benchmarks/serving/serving.py:
#          SERVE_PROMPTS, default 8,192, requests of 512 in / 128 out, greedy, 256 in flight), each arm
#          its own cluster; not in the default FIGURES (about a minute a round): FIGURES="std mixed lat serve"
# Env: ROUNDS (2); FIGURES ("std mixed lat"); MIXED_SEQS (the mixed figure's prompts, default 256: a
# ~1-s run whose rounds ranged 48k-84k tok/s on the H200; 4096 makes it ~15 s); ARMS ("base new"): more
# arms of this tree are written NAME=VAR=VALUE (e.g. torch=PDSERVE_FUSED_SAMPLING=0) and run
# EXTRA_FIGURES ("mixed std"); LAT_MODEL (the lat figure's model, default the Qwen3-0.6B shape).
# The table compares each arm with the first.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source benchmarks/launch_ready.sh
NEW=$PWD
LOG="${OUT:-/tmp/pdserve-gpu}/regress"
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1
BASE=/tmp/pdserve-regress-base
rm -rf $BASE && mkdir -p $BASE
if [ "${1:?usage: regress.sh BASE_DIR_OR_COMMIT|- [MODEL_DIR]}" = - ]; then
  :  # no base tree: the arms are this tree's, compared with the first
elif [ -d "$1" ]; then
  cp -r "$1"/. $BASE/
else
  git archive "$1" | tar -x -C $BASE || exit 1
fi
rm -rf $BASE/benchmarks && cp -r benchmarks $BASE/benchmarks  # the same measuring scripts
REAL="${2:-$(PYTHONPATH=$NEW${PYTHONPATH:+:$PYTHONPATH} python3 -m common.tools.default_model)}" || exit 1
Q=/tmp/qwen3-0.6b
[ -d $Q ] || PYTHONPATH=$NEW${PYTHONPATH:+:$PYTHONPATH} python3 -m common.tools.random_model \
  --preset qwen3-0.6b --out $Q --tokenizer-from "$REAL" >/dev/null || exit 1

figure() {  # figure NAME JSON: run one figure in the current directory's tree
  case $1 in
    std) python3 benchmarks/engine/offline.py --model $Q --quiet --engine-kwargs '{"max_num_seqs": 256}' --json-out "$2" ;;
    mixed) python3 benchmarks/engine/offline.py --model "$REAL" --quiet --input-len 128 512 --output-len 128 512 \
      --num-seqs "${MIXED_SEQS:-256}" --json-out "$2" ;;
    lat) python3 benchmarks/engine/latency.py --model "${LAT_MODEL:-$Q}" --decode-batches 1 64 --json-out "$2" ;;
    serve) serve_figure "$2" ;;
  esac 2>&1 | grep -v "Loading\|it/s\]" | tail -3
}

serve_figure() {  # the real model behind the router, one mixed worker: SERVE_PROMPTS requests of 512 in / 128 out
  local launch_log="${1%.json}.launch.txt"
  python3 -m deploy.launch --model "$REAL" --backend "${BACKEND:-local}" --port 0 --prefill 0 --decode 0 --mixed 1 --disagg never \
    --max-num-seqs 256 > "$launch_log" 2>&1 &
  local launch=$!
  wait_ready "$launch_log" $launch 180
  local url
  url=$(grep -o "http://[^ ]*/v1" "$launch_log" | head -1)
  if [ -n "$url" ]; then
    python3 benchmarks/serving/serving.py --base-url "$url" --num-prompts 32 --input-len 512 --output-len 16 >/dev/null 2>&1
    python3 benchmarks/serving/serving.py --base-url "$url" --client-procs 4 --num-prompts "${SERVE_PROMPTS:-8192}" \
      --input-len 512 --output-len 128 --max-concurrency 256 --json-out "$1"
  else
    echo "serve: the cluster did not start (see $launch_log)"
  fi
  kill -TERM $launch 2>/dev/null; wait $launch
}

for round in $(seq "${ROUNDS:-2}"); do
  for arm in ${ARMS:-base new}; do
    case $arm in
      base) dir=$BASE env=X=1 figs="${FIGURES:-std mixed lat}" ;;
      new) dir=$NEW env=X=1 figs="${FIGURES:-std mixed lat}" ;;
      *=*=*) dir=$NEW env=${arm#*=} figs="${EXTRA_FIGURES:-mixed std}" arm=${arm%%=*} ;;
      *) echo "unknown arm $arm" && exit 1 ;;
    esac
    for fig in $figs; do
      echo "== round $round, $arm, $fig"
      (cd $dir && export PYTHONPATH=$dir${PYTHONPATH:+:$PYTHONPATH} "$env" && figure $fig "$LOG/${fig}_${arm}_r$round.json")
    done
  done
done 2>&1 | tee "$LOG/runs.txt"
ARMS="${ARMS:-base new}"
python3 benchmarks/regress_table.py "$LOG" --ref "${ARMS%% *}"
