#!/usr/bin/env bash
# Speculative decoding on one GPU, in one device call (after benchmarks/device_prep.sh prepared the
# default model): its GPU tests, then the bf16 and float32 benchmark sweeps, logs under ${OUT}.
#   bash benchmarks/speculative/gpu_spec.sh            (SPEC_KS, SPEC_BATCHES, SPEC_DRAFT_LAYERS, SPEC_TESTS, ENGINE_TESTS override)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
LOG="${OUT:-/tmp/pdserve-spec}"
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$LOG/gpu.txt"
echo "commit ${PDSERVE_COMMIT:-unknown}" | tee -a "$LOG/gpu.txt"
python3 -m pytest -q -p no:cacheprovider -m gpu ${SPEC_TESTS:-tests/unit/common/test_gpu_speculative.py \
    tests/unit/prefill_worker/test_worker_engine.py} 2>&1 | tail -30 | tee "$LOG/tests.txt"
KS="${SPEC_KS:-4 8}"
python3 benchmarks/speculative/speculative.py --dtype bfloat16 --ks $KS --batches ${SPEC_BATCHES:-1 8 64} \
    --max-tokens 160 --draft-layers "${SPEC_DRAFT_LAYERS:-16}" --verbose 2>&1 | grep -v Loading | tee "$LOG/bf16.txt"
# The answers alone (each ends at its end-of-turn): the speed a user of the copy requests sees.
python3 benchmarks/speculative/speculative.py --dtype bfloat16 --ks $KS --batches 1 8 --max-tokens 160 \
    --workloads copy copy-long --stop-at-eos 2>&1 | grep -v Loading | tee "$LOG/bf16_eos.txt"
python3 benchmarks/speculative/speculative.py --dtype float32 --ks $KS --batches 1 8 --max-tokens 160 2>&1 \
    | grep -v Loading | tee "$LOG/fp32.txt"
if [ -n "${SPEC_PROFILE:-}" ]; then  # where the host's time goes in speculating steps
  python3 -m cProfile -s tottime benchmarks/speculative/speculative.py --dtype bfloat16 --ks 4 --batches 8 \
      --max-tokens 160 2>&1 | grep -v Loading | head -45 | tee "$LOG/profile.txt"
fi
# The engine's own GPU tests last: the graph path they check now also runs verification rows.
python3 -m pytest -q -p no:cacheprovider -m gpu ${ENGINE_TESTS:-tests/unit/common/test_gpu_engine.py} 2>&1 \
    | tail -30 | tee "$LOG/engine_tests.txt"
