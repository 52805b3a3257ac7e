# Session 35, call 6 (warm H100): decode splits at batch 1 on the 8B shape: 4 (the default rule), 2, 1.
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
export PYTHONUNBUFFERED=1 NEW=$PWD
source benchmarks/device_wheels.sh .dev/w35/*.whl || { echo WHEELS FAILED; exit 1; }
export PATH="/tmp/site/bin:$PATH"; SITE=/tmp/site
for a in split2:256 split1:2048; do
  d=/tmp/${a%%:*}; rm -rf $d && mkdir -p $d && tar --exclude=./.dev --exclude=./docs -cf - . | tar -xf - -C $d
  sed -i "s/^_MIN_SPLIT_TOKENS = 128/_MIN_SPLIT_TOKENS = ${a##*:}/" $d/common/attention/triton_kernels/decode_plan.py
done
[ -f /tmp/q8/config.json ] || PYTHONPATH=$NEW:$SITE timeout 150 python3 -m common.tools.random_model --preset qwen3-8b --out /tmp/q8 --device cuda > /dev/null 2>&1; echo "write $(el)s"
for r in 1 2; do for arm in new:$NEW split2:/tmp/split2 split1:/tmp/split1; do
  d=${arm#*:}; [ $(el) -gt 230 ] && break 2
  (cd $d && PYTHONPATH=$d:$SITE timeout 60 python3 benchmarks/engine/latency.py --model /tmp/q8 --decode-batches 1 --decode-tokens 256 \
    --prefill-prompts 1 --prefill-len 256 > $OUT/${arm%%:*}_$r.txt 2>&1)
  echo "${arm%%:*} r$r: $(grep -h 'batch-' $OUT/${arm%%:*}_$r.txt) $(el)s"
done; done
