#!/usr/bin/env bash
# A chaos soak longer than one device call (a call lasts at most 10 minutes), in two calls on one warm
# machine: `start` launches benchmarks/chaos/chaos.py under setsid (it outlives the call) and waits
# WAIT_S seconds (default 570); `collect`, issued at once after (the machine goes back ~30 s after a
# call ends, and the soak with it), waits for the soak to end and copies its log, JSON and cluster logs
# to $OUT. Source benchmarks/device_prep.sh first in each call (the model and packages).
#   bash benchmarks/chaos/device_soak.sh start [chaos.py flags...]   (default: 10 minutes, 2P+2D, 4 fronts)
#   bash benchmarks/chaos/device_soak.sh collect
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
DIR=${SOAK_DIR:-/tmp/pdserve-soak}
case ${1:-} in
  start)
    shift
    mkdir -p "$DIR"
    flags=("$@")
    [ ${#flags[@]} -eq 0 ] && flags=(--minutes 10 --prefill 2 --decode 2 --kv-transport auto --seed 1
      --fault-every 8 --warmup-s 60 --quiesce-timeout 90 --dtype float32 --api-servers 4 --concurrency 16)
    setsid nohup python3 benchmarks/chaos/chaos.py "${flags[@]}" --json-out "$DIR/soak.json" \
      --log-dir "$DIR/logs" > "$DIR/soak.log" 2>&1 < /dev/null &
    echo "soak started (pid $!): ${flags[*]}"
    sleep "${WAIT_S:-570}"
    tail -3 "$DIR/soak.log" ;;
  collect)
    for _ in $(seq 1 "${WAIT_S:-400}"); do pgrep -f benchmarks/chaos/chaos.py > /dev/null || break; sleep 1; done
    if pgrep -f benchmarks/chaos/chaos.py > /dev/null; then echo "the soak is still running"; fi
    [ -f "$DIR/soak.log" ] || { echo "no soak on this machine (a fresh one?): $DIR/soak.log is missing"; exit 1; }
    tail -30 "$DIR/soak.log"
    tar czf "${OUT:-/tmp}/soak.tgz" -C "$(dirname "$DIR")" "$(basename "$DIR")" ;;
  *) echo "usage: $0 start [chaos.py flags...] | collect" >&2; exit 2 ;;
esac
