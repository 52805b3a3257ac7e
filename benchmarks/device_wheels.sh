# Source on a lent GPU machine: install the given wheels into /tmp/site, once per machine (the marker
# lets a later call on the same warm machine skip them). Used by device_prep.sh and device_ray.sh.
#   source benchmarks/device_wheels.sh WHEEL...
if [ ! -f /tmp/site/.pdserve-wheels ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$@" \
    && touch /tmp/site/.pdserve-wheels || return 1
fi
