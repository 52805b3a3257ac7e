# Source this: `wait_ready LOG PID SECONDS` waits until the launcher's LOG says "pdserve ready" (returns
# 0), or the launcher (PID) has exited or SECONDS have passed (returns 1), so a cluster that cannot start
# costs the seconds it took to fail, not the whole wait (on a lent GPU every minute counts).
wait_ready() {
  local _
  for _ in $(seq 1 "$3"); do
    grep -q "pdserve ready" "$1" 2>/dev/null && return 0
    kill -0 "$2" 2>/dev/null || { grep -q "pdserve ready" "$1" 2>/dev/null; return; }
    sleep 1
  done
  return 1
}
