# Session 35, call 2 (carry .dev/m1 .whl .dev/run): stage the model's first part, then on the 8B shape
# base (HEAD) / new (PDL launch-next-then-wait in the norm, rope store, attention) / head (new + GEMV LM
# head) / split64 (new, decode splits of 64 tokens), two rounds; then GPU tests of the changed kernels.
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
export PYTHONUNBUFFERED=1
NEW=$PWD
mkdir -p /tmp/gg && cp .dev/m1/* /tmp/gg/
source benchmarks/device_wheels.sh .dev/w35/*.whl || { echo WHEELS FAILED; exit 1; }
export PATH="/tmp/site/bin:$PATH"; SITE=/tmp/site
nproc; nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
rm -rf /tmp/base27 /tmp/split64 && mkdir -p /tmp/base27 /tmp/split64
tar --exclude=./.dev --exclude=./.whl --exclude=./docs -cf - . | tar -xf - -C /tmp/base27
tar --exclude=./.dev --exclude=./.whl --exclude=./docs -cf - . | tar -xf - -C /tmp/split64
(cd /tmp/base27 && patch -R -p1 < $NEW/.dev/run/s35.patch > /dev/null) || { echo PATCH FAILED; exit 1; }
sed -i 's/^_MIN_SPLIT_TOKENS = 128/_MIN_SPLIT_TOKENS = 64/' /tmp/split64/common/attention/triton_kernels/decode_plan.py
grep -c "launch_next" /tmp/base27/common/layers/pdl.py /tmp/split64/common/layers/pdl.py; grep "^_MIN_SPLIT" /tmp/split64/common/attention/triton_kernels/decode_plan.py
[ -f /tmp/q8/config.json ] || PYTHONPATH=$NEW:$SITE timeout 150 python3 -m common.tools.random_model --preset qwen3-8b --out /tmp/q8 --device cuda > $OUT/write.txt 2>&1; echo "write rc=$? $(el)s"
lat() {  # lat NAME DIR ENV ROUND
  ( cd $2 && env $3 PYTHONPATH=$2:$SITE timeout 90 python3 benchmarks/engine/latency.py --model /tmp/q8 --decode-batches 1 2 64 \
      --decode-tokens 256 --prefill-prompts 1 --prefill-len 256 --json-out $OUT/lat_$1_$4.json > $OUT/lat_$1_$4.txt 2>&1 )
  echo "$1 r$4: $(grep -h 'batch-' $OUT/lat_$1_$4.txt | sed 's/ decode at 1000 context//' | tr '\n' ' ') $(el)s"
}
for r in 1 2; do
  lat base /tmp/base27 X=1 $r
  lat new $NEW X=1 $r
  lat head $NEW PDSERVE_GEMV_LM_HEAD=1 $r
  lat split64 /tmp/split64 X=1 $r
done
PYTHONPATH=$NEW:$SITE timeout 60 python3 benchmarks/engine/kernel_profile.py --model /tmp/q8 --rows 1 --top 8 > $OUT/profile_b1.txt 2>&1; grep "==" $OUT/profile_b1.txt; echo "profile $(el)s"
PYTHONPATH=$NEW:$SITE timeout $((570 - $(el))) python3 -m pytest -q -p no:cacheprovider -m gpu tests/unit/common/layers tests/unit/common/attention \
  tests/unit/common/test_gpu_engine.py > $OUT/gputests.txt 2>&1; echo "gpu tests rc=$? $(el)s"; tail -4 $OUT/gputests.txt
cd $OUT && tar czf logs.tgz *.txt *.json 2>/dev/null; echo "done $(el)s"
