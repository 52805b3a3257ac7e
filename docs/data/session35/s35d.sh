# Session 35, call 4 (carry .dev/w35 .dev/run): GPU tests of the LM-head rule, the runner and the multiplexed
# worker on this tree; then the 8B shape against its floors (batch 1, 64; prefill 8 x 2,048).
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
export PYTHONUNBUFFERED=1
source benchmarks/device_wheels.sh .dev/w35/*.whl || { echo WHEELS FAILED; exit 1; }
export PATH="/tmp/site/bin:$PATH" PYTHONPATH="$PWD:/tmp/site"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 290 python3 -m pytest -q -p no:cacheprovider -m gpu tests/unit/common/layers/test_lm_head.py tests/unit/common/runner \
  tests/unit/common/multiplex > $OUT/gputests.txt 2>&1; echo "gpu tests rc=$? $(el)s"; tail -4 $OUT/gputests.txt
timeout $((450 - $(el))) python3 benchmarks/engine/floors.py --random-model qwen3-8b --json-out $OUT/floors8b.json > $OUT/floors8b.txt 2>&1
echo "floors rc=$? $(el)s"; grep -v Loading $OUT/floors8b.txt | tail -6
