#!/usr/bin/env bash
# Host time hidden behind the GPU (issue 17, item 4), as ratios from one device call: the offline standard
# workload, a base commit's tree against this one's, alternated, with this tree's options as more arms
# (nolf: decode attention in row order, PDSERVE_DECODE_LONGEST_FIRST=0; newf: the fused sampler,
# PDSERVE_FUSED_SAMPLING=1); then this tree's offline profile (GPU busy vs wall, kernels by family) and,
# with OVERLAP=1, the decode-phase overlap at batch 1/64/256 per arm.
#   bash benchmarks/engine/gpu_host_ab.sh TOKENIZER_DIR BASE_COMMIT     (logs go to ${OUT:-/tmp/pdserve-gpu})
#   ARMS="base new nolf newf" ROUNDS=2 choose the arms and how often each runs.
# Needs on PYTHONPATH what the device image lacks (llguidance, pyzmq: wheels installed as in
# benchmarks/device_prep.sh); TOKENIZER_DIR holds the default model's tokenizer and config files only.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
LOG="${OUT:-/tmp/pdserve-gpu}"
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1
M=/tmp/qwen3-0.6b
NEW=$PWD
BASE=/tmp/pdserve-base
[ -d $M ] || python3 -m common.tools.random_model --preset qwen3-0.6b --out $M --tokenizer-from "${1:?tokenizer dir}" >/dev/null
rm -rf $BASE && mkdir -p $BASE && git archive "${2:?base commit}" | tar -x -C $BASE
# The same measuring code in both trees. A base from before benchmarks/ was grouped keeps its offline.py
# at benchmarks/engine/offline.py: each arm runs its own tree's offline script, wherever it lies.
mkdir -p $BASE/benchmarks/engine
cp benchmarks/engine/host_overlap.py benchmarks/engine/offline_profile.py $BASE/benchmarks/engine/
[ -f $BASE/benchmarks/engine/offline.py ] || cp $BASE/benchmarks/offline.py $BASE/benchmarks/engine/
git log --oneline -1
offline_script() { ls benchmarks/engine/offline.py benchmarks/engine/offline.py 2>/dev/null | head -1; }  # of the tree in .
arm() {  # arm NAME: run in the base tree or this one, with or without the fused sampler
  case $1 in
    base) echo "$BASE X=1" ;;
    new) echo "$NEW X=1" ;;
    nolf) echo "$NEW PDSERVE_DECODE_LONGEST_FIRST=0" ;;
    newf) echo "$NEW PDSERVE_FUSED_SAMPLING=1" ;;
  esac
}
ARMS="${ARMS:-base new nolf newf}"
for cfg in $(for _ in $(seq "${ROUNDS:-2}"); do echo $ARMS; done); do
  read -r D E <<<"$(arm $cfg)"
  echo "== offline $cfg"
  (cd $D && env $E python3 "$(offline_script)" --model $M --quiet --engine-kwargs '{"max_num_seqs": 256}' \
      --json-out "$LOG/off_$cfg.json" 2>&1 | tail -2)
done 2>&1 | tee "$LOG/offline_ab.txt"
PDSERVE_FUSED_SAMPLING=${PROFILE_FUSED:-0} python3 benchmarks/engine/offline_profile.py --model $M --top 12 \
    --json-out "$LOG/offprof.json" 2>&1 | grep -v "Loading\|arn" | tee "$LOG/offprof.txt"
[ "${OVERLAP:-0}" = 1 ] || exit 0
for cfg in $ARMS; do
  read -r D E <<<"$(arm $cfg)"
  echo "== host overlap $cfg"
  (cd $D && env $E python3 benchmarks/engine/host_overlap.py --model $M --json-out "$LOG/overlap_$cfg.json" 2>&1 | tail -4)
done 2>&1 | tee "$LOG/overlap.txt"
