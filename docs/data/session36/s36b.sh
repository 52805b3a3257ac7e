# Session 36, call 2 (after s36a.sh): the real default model served on one GPU, ARMS at one long prompt a second.
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
D=/tmp/pd36r.$T0
source benchmarks/device_prep.sh || { echo PREP FAILED; exit 1; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt; echo "prep $(el)s"
( while true; do for a in $ARMS; do for f in $D/$a/*/interference@*.txt; do [ -f "$f" ] && cp "$f" $OUT/real_${a}_$(basename "$f"); done; done; sleep 3; done ) &
LONG_RATES=${LONG_RATES:-1} REPEAT=${REPEAT:-3} INTERF_S=30 ITL_SLO_MS=15 OUT=$D timeout $((${LIMIT:-570} - $(el))) bash benchmarks/serving/pd_one_gpu.sh > $OUT/table.txt 2>&1
sleep 4; tail -40 $OUT/table.txt; echo "done $(el)s"
for a in $ARMS; do cp $D/$a/step_classes.txt $OUT/real_${a}_step_classes.txt 2>/dev/null; grep -h -E "WARNING|ERROR|out of memory" $D/$a/*/logs/* 2>/dev/null | tail -40 >> $OUT/real_${a}_step_classes.txt; done
cd $OUT && tar czf served_real.tgz real_* table.txt gpu.txt 2>/dev/null; rm -f real_*
