# Session 32: wheels + 8B shape + served ARMS at LONG_RATES (default 1); interference files of every rate come back.
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
D=/tmp/pd32.$T0  # a fresh folder per call: the logs of earlier calls stay out of this one's step classes
source benchmarks/device_wheels.sh .whl/*.whl || { echo WHEELS FAILED; exit 1; }
export PATH="/tmp/site/bin:$PATH" PYTHONPATH="/tmp/site:$PWD" PDSERVE_CACHE_DIR=/tmp/pdcache PYTHONUNBUFFERED=1
[ -f /tmp/q8/config.json ] || python3 -m common.tools.random_model --preset qwen3-8b --out /tmp/q8 --tokenizer-from .dev/tok --device cuda >/dev/null 2>$OUT/make8b.txt
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/gpu.txt
echo "ready $(el)s"
( while true; do
    for a in $ARMS; do for f in $D/$a/*/interference@*.txt; do [ -f "$f" ] && cp "$f" $OUT/${a}_$(basename "$f"); done; done
    sleep 3; done ) &
LONG_RATES="${LONG_RATES:-1}" REPEAT=${REPEAT:-3} INTERF_S=30 ITL_SLO_MS=50 OUT=$D timeout $((${LIMIT:-540} - $(el))) bash benchmarks/serving/pd_one_gpu.sh /tmp/q8 > $OUT/table.txt 2>&1
sleep 4; tail -30 $OUT/table.txt; echo "done $(el)s"
for a in $ARMS; do cp $D/$a/step_classes.txt $OUT/${a}_worker_tail.txt 2>/dev/null; grep -h -E "WARNING|ERROR|out of memory" $D/$a/*/logs/* 2>/dev/null | tail -80 >> $OUT/${a}_worker_tail.txt; done
cd $OUT && tar czf served.tgz *_interference* *_worker_tail.txt table.txt gpu.txt make8b.txt 2>/dev/null; rm -f *_interference*
