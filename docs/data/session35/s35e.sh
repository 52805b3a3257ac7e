# Session 35, call 5: only on an H200: the 8B shape against its floors with this tree (the summary line).
set -u
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
grep -q H200 $OUT/gpu.txt || { echo "not an H200: nothing run"; exit 0; }
export PYTHONUNBUFFERED=1
source benchmarks/device_wheels.sh .dev/w35/*.whl || { echo WHEELS FAILED; exit 1; }
export PATH="/tmp/site/bin:$PATH" PYTHONPATH="$PWD:/tmp/site"
git log --oneline -1 2>/dev/null
timeout 280 python3 benchmarks/engine/floors.py --random-model qwen3-8b --json-out $OUT/floors8b_h200.json > $OUT/floors8b_h200.txt 2>&1
echo "floors rc=$?"; grep -v Loading $OUT/floors8b_h200.txt | tail -5
