#!/usr/bin/env bash
# On a lent GPU machine (a call carrying .ray/p2 and .whl, after one that ran
# `mkdir -p /tmp/raywhl && cp .ray/p1/* /tmp/raywhl/`): join Ray's wheel, check it, and install it with
# the wheels it needs and the project's (.whl) into /tmp/site; then `source benchmarks/device_prep.sh`
# in a later call skips the wheels (see benchmarks/device_carry.sh for the whole sequence).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
W=/tmp/raywhl  # not /tmp/ray: Ray keeps its sessions there
wheel=$(cat .ray/p2/WHEEL)
cat "$W/ray.part.00" .ray/p2/ray.part.01 > "$W/$wheel"
(cd "$W" && sha256sum -c "$OLDPWD/.ray/p2/SHA256")
cp .ray/p2/*.whl "$W/"
rm -f /tmp/site/.pdserve-wheels  # Ray's wheels join the project's, even on a machine that has those
source benchmarks/device_wheels.sh "$W"/*.whl .whl/*.whl
PYTHONPATH=/tmp/site python3 -c "import ray, zmq, fastapi; print('ray', ray.__version__, 'zmq', zmq.__version__)"
