# Session 35, call 3 (right after s35b.sh; carry .dev/m2 .dev/run): the real default model, base / new / head,
# offline mixed workload (1,024 prompts) and batch-1/64 decode, two rounds (benchmarks/regress.sh).
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
source benchmarks/device_prep.sh || { echo PREP FAILED; exit 1; }
echo "prep $(el)s"; nvidia-smi --query-gpu=name --format=csv,noheader
REAL=$(python3 -m common.tools.default_model)
ARMS="base new head=PDSERVE_GEMV_LM_HEAD=1" FIGURES="mixed lat" EXTRA_FIGURES="mixed lat" LAT_MODEL=$REAL MIXED_SEQS=1024 ROUNDS=2 \
  timeout $((560 - $(el))) bash benchmarks/regress.sh /tmp/base27 $REAL > $OUT/regress.txt 2>&1
echo "regress rc=$? $(el)s"; grep -v "^== round" $OUT/regress.txt | tail -30
cd $OUT && tar czf regress.tgz regress 2>/dev/null; echo "done $(el)s"
